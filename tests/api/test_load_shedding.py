# Admission refuses on the predicted time to first token (api/load_shedding.py): every request
# admitted and not started anywhere (the tokens queued in Redis, the work in the engines' waiting
# queues), priced with the workers' step prices, less what the fleet can start at once, against
# max_queue_wait_s (flex: batch_max_queue_wait_s). Interactive waits behind interactive work only;
# flex behind both. A refused request gets 503 `overloaded` with the Retry-After the backlog needs
# to fall back under the bound. The test plays the worker: its stats report its prices and what
# waits in its engine, and the queues' token counters the work queued. Before a worker is priced
# the fallback is the queued tokens over its measured tokens per second.
from __future__ import annotations

import math
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
    # 8 s of interactive work ahead: interactive fits the 10 s bound, flex waits 8 + 25 s
    # against its own 30 s.
    load(interactive=int(8 * RATE), batch=int(25 * RATE))

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


# A priced worker: a prompt token costs 1 ms of its time, an output token 10 ms; the mean
# request (100 in, 100 out, as its stats say) 1.1 s.
PRICES = {
    "tokens_per_s": RATE, "mean_output_tokens": 100, "mean_prompt_tokens": 100,
    "prefill_token_s": 0.001, "decode_token_s": 0.01,
}  # fmt: skip
MEAN_WORK_S = 100 * 0.001 + 100 * 0.01


@pytest.fixture
def priced(rds, worker):
    """Publishes the played worker's prices, what it may start and what waits in its engine."""

    def publish(
        *,
        startable: int,
        interactive_s: float,
        batch_s: float = 0.0,
        kv: bool = False,
        startable_batch: int | None = None,
    ):
        rds.hset(p.stats_key(worker.id), mapping=PRICES | {
            "startable": startable, "startable_interactive": startable,
            "startable_batch": startable if startable_batch is None else startable_batch,
            "limited_by": "kv" if kv else "seats",
            "waiting_work_s_interactive": interactive_s, "waiting_work_s_batch": batch_s,
        })  # fmt: skip

    yield publish
    rds.delete(p.stats_key(worker.id))


def metric(app_client, admin, name: str) -> float:
    r = app_client.get("/metrics", headers={"Authorization": f"Bearer {admin.key}"})
    lines = [ln for ln in r.text.splitlines() if ln.startswith(name)]
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines)


def test_work_waiting_in_an_engine_counts_toward_the_predicted_ttft(
    app_client, make_tenant, tenant, priced
):
    admin = make_tenant(admin=True)
    label = 'fleetlm:overload_refusals_total{priority="interactive",reason="ttft"}'
    refused_before = metric(app_client, admin, label)
    # Nothing in Redis, but 20 s of interactive work waits inside the engine, which can start
    # nothing more: a new request waits that and the mean request's time for a seat.
    priced(startable=0, interactive_s=20.0)
    r = post(app_client, tenant)
    assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded"
    ttft = 20.0 + MEAN_WORK_S + 10 * 0.001  # its own prompt: 10 tokens
    assert r.headers["retry-after"] == str(math.ceil(ttft - SETTINGS.max_queue_wait_s))
    assert metric(app_client, admin, label) == refused_before + 1
    assert metric(app_client, admin, "fleetlm:predicted_ttft_seconds_count") > 0


def test_flex_work_in_the_engine_never_holds_interactive_back(app_client, tenant, worker, priced):
    # 100 s of flex work waits in the engine: flex is refused, interactive starts at once.
    priced(startable=2, interactive_s=0.0, batch_s=100.0)
    flex = post(app_client, tenant, service_tier="flex")
    assert flex.status_code == 503
    assert int(flex.headers["retry-after"]) >= 100 - SETTINGS.batch_max_queue_wait_s - 2
    with ThreadPoolExecutor(1) as pool:
        interactive = pool.submit(post, app_client, tenant)
        taken = worker.take(tenant)
        worker.publish(taken.request_id, worker.done("ok", 10, 4))
        assert interactive.result(timeout=30).status_code == 200


def test_flex_is_forecast_with_the_room_the_worker_takes_flex_in(app_client, tenant, priced):
    # The worker may start 10 mean requests (11 s of work), but keeps them for interactive
    # arrivals: none for flex. 35 s of flex work waits in the engine, so a flex request waits
    # 35 s + its own 1.1 s, past its 30 s bound (counted with the room of 10 it would be 25 s).
    priced(startable=10, interactive_s=0.0, batch_s=35.0, startable_batch=0)
    flex = post(app_client, tenant, service_tier="flex")
    assert flex.status_code == 503 and flex.json()["error"]["code"] == "overloaded"
    assert int(flex.headers["retry-after"]) >= 35 + MEAN_WORK_S - SETTINGS.batch_max_queue_wait_s


def test_what_the_fleet_can_start_at_once_waits_for_nothing(app_client, tenant, worker, priced):
    # 5 s of work waits, but the worker may start 10 mean requests (11 s of work) now.
    priced(startable=10, interactive_s=5.0)
    with ThreadPoolExecutor(1) as pool:
        admitted = pool.submit(post, app_client, tenant)
        taken = worker.take(tenant)
        worker.publish(taken.request_id, worker.done("ok", 10, 4))
        assert admitted.result(timeout=30).status_code == 200


def test_a_fleet_out_of_kv_headroom_refuses_with_reason_kv(app_client, make_tenant, tenant, priced):
    admin = make_tenant(admin=True)
    label = 'fleetlm:overload_refusals_total{priority="interactive",reason="kv"}'
    before = metric(app_client, admin, label)
    priced(startable=0, interactive_s=30.0, kv=True)
    r = post(app_client, tenant)
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
    assert metric(app_client, admin, label) == before + 1
