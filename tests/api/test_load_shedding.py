# Admission sheds on the predicted queue wait (api/load_shedding.py): the tokens queued ahead of
# a request over the workers' service rate, against max_queue_wait_s. Interactive waits behind
# interactive work only; flex (batch) behind both, so it is shed first. A shed request gets 503
# `overloaded` with the Retry-After the queue needs to drain back under the bound. The test
# plays the worker: its stats report the rate, and the queues' token counters the work queued.
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from service import streams as p
from tests.api.conftest import SETTINGS
from tests.wire import queued_request

pytestmark = pytest.mark.timeout(60)

RATE = 100.0  # tokens per second the played worker reports


@pytest.fixture
def load(rds, worker):
    """Sets the tokens queued per priority; one undelivered entry on each queue keeps the
    counters from being reset as stale."""
    rds.hset(p.stats_key(worker.id), mapping={"tokens_per_s": RATE, "mean_output_tokens": 8})
    entries = {prio: rds.xadd(p.queue_key(prio), {"r": queued_request().encode()})
               for prio in p.PRIORITIES}  # fmt: skip

    def set_load(interactive: int, batch: int) -> None:
        rds.set(p.queued_tokens_key("interactive"), interactive)
        rds.set(p.queued_tokens_key("batch"), batch)

    yield set_load
    for prio, entry_id in entries.items():
        rds.xdel(p.queue_key(prio), entry_id)
        rds.delete(p.queued_tokens_key(prio))
    rds.delete(p.stats_key(worker.id))


def post(app_client, tenant, **extra):
    return app_client.post(
        "/v1/completions",
        json={"model": "tiny", "prompt": list(range(1, 11)), "max_tokens": 4} | extra,
        headers={"Authorization": f"Bearer {tenant.key}"},
    )


def test_a_request_that_would_wait_too_long_is_shed_with_an_honest_retry_after(
    app_client, tenant, load
):
    load(interactive=int(50 * RATE), batch=0)  # 50 s of work ahead, the bound is 10 s
    r = post(app_client, tenant)
    assert r.status_code == 503
    body = r.json()["error"]
    assert body["code"] == "overloaded" and body["type"] == "server_error"
    assert r.headers["retry-after"] == str(int(50 - SETTINGS.max_queue_wait_s))


def test_flex_is_shed_before_interactive(app_client, tenant, worker, load):
    # 8 s of interactive work ahead: interactive fits the 10 s bound, flex waits 8 + 5 s.
    load(interactive=int(8 * RATE), batch=int(5 * RATE))

    flex = post(app_client, tenant, service_tier="flex")
    assert flex.status_code == 503 and flex.json()["error"]["code"] == "overloaded"
    assert flex.headers["retry-after"] == "3"
    with ThreadPoolExecutor(1) as pool:
        interactive = pool.submit(post, app_client, tenant)
        taken = worker.take(tenant)
        # It adds prompt + expected output (the workers' mean, under max_tokens) to the queue.
        assert taken.queued_tokens == 10 + 4
        worker.publish(taken.request_id, worker.done("ok", 10, 4))
        assert interactive.result(timeout=30).status_code == 200
