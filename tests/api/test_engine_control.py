# The control endpoints' fan-out in process (api/control.py), the test playing the workers over
# the wire (service/control.py): every live worker gets the command and its reply is reported; a
# worker whose heartbeat is gone is skipped; a live one that stays silent makes a retryable 503.
# The real worker's side runs in tests/e2e/test_engine_control.py.
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from service import streams as p
from service.control import ControlCommand, ControlReply
from tests.api.conftest import SETTINGS, PlayedWorker

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def admin(make_tenant) -> dict[str, str]:
    return {"Authorization": f"Bearer {make_tenant(admin=True).key}"}


@pytest.fixture
def played(rds):
    workers: list[PlayedWorker] = []

    def make() -> PlayedWorker:
        w = PlayedWorker(rds)
        w.heartbeat()
        workers.append(w)
        return w

    yield make
    for w in workers:
        w.die()
        rds.srem(p.WORKERS_SET, w.id)
        rds.delete(p.control_key(w.id))


def _answer(rds, worker: PlayedWorker, result: dict) -> ControlCommand:
    """Takes the worker's next command and replies as a worker does."""
    _, raw = rds.blpop([p.control_key(worker.id)], timeout=10)
    command = ControlCommand.decode(raw)
    rds.lpush(command.reply_to, ControlReply(worker.id, True, result).encode())
    return command


def test_every_live_worker_answers_and_a_dead_one_is_skipped(app_client, admin, rds, played):
    first, second, dead = played(), played(), played()
    dead.die()  # still in the workers set, heartbeat gone
    with ThreadPoolExecutor(2) as pool:
        answers = [
            pool.submit(_answer, rds, first, {"freed_blocks": 3}),
            pool.submit(_answer, rds, second, {"freed_blocks": 4}),
        ]
        r = app_client.post("/reset_prefix_cache", headers=admin)
        commands = [a.result(timeout=10) for a in answers]
    assert r.status_code == 200, r.text
    assert r.json()["freed_blocks"] == 7
    assert {w["worker"]: w["freed_blocks"] for w in r.json()["workers"]} == {
        first.id: 3,
        second.id: 4,
    }
    assert {c.command for c in commands} == {"reset_prefix_cache"}
    assert not rds.exists(p.control_key(dead.id))


def test_a_silent_live_worker_is_a_retryable_503(app_client, admin, rds, played):
    answering, silent = played(), played()
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(_answer, rds, answering, {"started": True})
        r = app_client.post("/start_profile", headers=admin)
        answer.result(timeout=10)
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "worker_timeout"
    assert silent.id in r.json()["error"]["message"]
    assert r.headers["retry-after"] == "1"
    # The command it never took is past its deadline: taken now, a worker would drop it.
    command = ControlCommand.decode(rds.lpop(p.control_key(silent.id)))
    assert command.command == "start_profile"
    assert command.deadline <= time.time() + 0.5
    assert command.deadline >= time.time() - SETTINGS.control_timeout_s - 30


def test_with_no_live_worker_it_is_a_503(app_client, admin):
    r = app_client.post("/stop_profile", headers=admin)
    assert r.status_code == 503 and r.json()["error"]["code"] == "no_workers"
