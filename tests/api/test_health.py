# /health says the API process answers; /ready, what a client waits for, is 200 only while Redis
# answers and a worker is live (its heartbeat key), and 503 before the first one and after the last.
from __future__ import annotations

from service import streams as p
from tests.api.conftest import PlayedWorker
from tests.waiting import wait_until


def test_ready_only_while_a_worker_is_live(app_client, rds):
    def ready_status() -> int:
        return app_client.get("/ready").status_code

    assert app_client.get("/health").json() == {"status": "ok"}
    # Other tests' workers (in process, same Redis) are gone once their heartbeat keys expire.
    wait_until(lambda: ready_status() == 503, 60, "no live worker")
    body = app_client.get("/ready").json()
    assert body["status"] == "not ready" and body["workers"] == 0 and body["redis"] is True
    assert app_client.get("/health").status_code == 200  # the process answers all the same

    w = PlayedWorker(rds)
    try:
        w.heartbeat()
        r = app_client.get("/ready")
        assert r.status_code == 200 and r.json()["status"] == "ready" and r.json()["workers"] == 1
        w.die()  # its heartbeat key gone: taken for dead
        assert ready_status() == 503
    finally:
        w.die()
        rds.srem(p.WORKERS_SET, w.id)
