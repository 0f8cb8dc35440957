# The GPU worker's exchange with Redis, in process: a request's deltas then one final event, one
# usage record whatever the end (built from the engine's counters), the queue entry acknowledged
# and removed, the tenant's reservation released and its unused tokens refunded; cancels abort
# and free the KV blocks; entries of a dead worker are re-run or failed.
from __future__ import annotations

import pytest

from metering.ratelimit import PriorityLimit
from service import limit_reservations as rl
from service import streams as p
from service.events import encode_event
from tests.waiting import wait_until
from tests.wire import queued_request
from tests.workers.conftest import (
    SETTINGS,
    WORKER_ID,
    events,
    records_of,
    submit,
    usage_record,
    worker_stats,
)

pytestmark = pytest.mark.timeout(120)


def reserve(rds, queued, tokens: int) -> None:
    """The reservation admission makes (service/limit_reservations.py), riding on the request."""
    limit = PriorityLimit(max_concurrency=4, tokens_per_minute=10_000)
    call = rl.reserve_call(
        queued.tenant_id, queued.priority, limit, queued.request_id, tokens, 3600
    )
    decision = rl.decision(rds.eval(*call))
    assert decision.admitted
    queued.reservation = rl.Reservation(decision.window, tokens)


def test_a_request_streams_then_ends_with_one_record_and_a_refund(gpu_worker, rds):
    queued = queued_request(max_tokens=6)
    reserve(rds, queued, tokens=100)
    submit(rds, queued)
    got = events(rds, queued.request_id)
    *deltas, done = got
    assert deltas and {e["type"] for e in deltas} == {"delta"}
    assert {e["worker"] for e in got} == {WORKER_ID}
    assert [e["completion_tokens"] for e in deltas] == sorted(
        e["completion_tokens"] for e in deltas
    )
    assert done["type"] == "done" and done["finish_reason"] == "length"
    assert done["usage"]["prompt_tokens"] == 10 and done["usage"]["completion_tokens"] == 6

    record = usage_record(rds, queued.request_id)
    assert record.counts == done["usage"]  # the engine's counters, as the event carried them
    assert (record.status, record.finish_reason, record.worker_id) == (
        "length",
        "length",
        WORKER_ID,
    )
    assert (record.tenant_id, record.priority, record.batch_id) == (
        queued.tenant_id,
        "interactive",
        None,
    )
    assert record.enqueued_at == queued.enqueued_at < record.finished_at
    assert 0 <= record.queue_ms <= record.ttft_ms <= record.e2e_ms and record.tpot_ms > 0
    assert record.error is None

    queue = p.queue_key("interactive")
    wait_until(lambda: rds.xlen(queue) == 0, 10, "the entry to leave the queue")
    assert rds.xpending(queue, p.GROUP)["pending"] == 0
    assert rds.zcard(rl.running_key(queued.tenant_id, "interactive")) == 0  # slot released
    window = rl.window_key(queued.tenant_id, "interactive", queued.reservation.window)
    assert int(rds.get(window)) == 16  # 100 reserved, 10 + 6 used: 84 refunded
    assert len(records_of(rds, queued.request_id)) == 1


def test_a_cancel_aborts_the_request_and_frees_its_blocks(gpu_worker, rds):
    queued = queued_request(max_tokens=2000)
    submit(rds, queued)
    wait_until(lambda: rds.xlen(p.output_key(queued.request_id)), 60, "the first delta")
    rds.set(p.cancel_key(queued.request_id), "1")
    final = events(rds, queued.request_id)[-1]
    assert final["type"] == "error" and final["code"] == "cancelled"
    record = usage_record(rds, queued.request_id)
    assert (record.status, record.finish_reason) == ("cancelled", "abort")
    assert 1 <= record.counts["completion_tokens"] < 2000
    assert record.counts == final["usage"]

    def idle():
        stats = worker_stats(rds)
        return stats["num_free_blocks"] == stats["num_total_blocks"] and stats["num_running"] == "0"

    wait_until(idle, 10, "the KV blocks to be free")
    stats = worker_stats(rds)
    assert int(stats["step"]) - int(stats["last_cancel_step"]) <= 2


def test_a_request_the_engine_refuses_fails_with_one_record(gpu_worker, rds):
    queued = queued_request(max_tokens=4)
    submit(rds, queued, temperature=-1.0)  # out of the engine's range
    (final,) = events(rds, queued.request_id)
    assert final["type"] == "error" and final["code"] == "invalid_request"
    assert "temperature" in final["message"]
    record = usage_record(rds, queued.request_id)
    assert (record.status, record.finish_reason) == ("failed", "error")
    assert record.counts["prompt_tokens"] == 10 and record.counts["completion_tokens"] == 0
    assert "temperature" in record.error


def test_a_dead_workers_entries_are_rerun_or_resumed(gpu_worker, rds):
    # Another consumer read two requests and went silent: one had already streamed 3 tokens.
    queue = p.queue_key("interactive")
    streamed, unstarted = queued_request(max_tokens=5), queued_request(max_tokens=5)
    first = {"type": "delta", "text": "ab", "worker": "w-dead", "completion_tokens": 3}
    first |= {"token_ids": [7, 8, 9], "cached_tokens": 0}
    # Enqueued and read by the dead consumer in one transaction: our worker cannot read them first.
    pipe = rds.pipeline(transaction=True)
    for queued in (streamed, unstarted):
        pipe.xadd(queue, {"r": queued.encode()})
    pipe.xreadgroup(p.GROUP, "w-dead", {queue: ">"}, count=2)
    taken = pipe.execute()[-1]
    assert sum(len(entries) for _, entries in taken) == 2, taken
    rds.xadd(p.output_key(streamed.request_id), encode_event(first))

    # Resumed after the 3 tokens the stream holds: a resume event, then the last 2 tokens (the
    # fifth with the final event).
    got = events(rds, streamed.request_id)
    assert [e["type"] for e in got[:2]] == ["delta", "resume"] and got[1]["worker"] == WORKER_ID
    assert [(e["type"], e.get("completion_tokens")) for e in got[2:-1]] == [("delta", 4)]
    assert got[-1]["type"] == "done" and got[-1]["usage"]["completion_tokens"] == 5
    record = usage_record(rds, streamed.request_id)
    assert record.status == "length" and record.worker_id == WORKER_ID
    assert record.counts["completion_tokens"] == 5 and record.counts["prompt_tokens"] == 10
    assert len(records_of(rds, streamed.request_id)) == 1

    rerun = events(rds, unstarted.request_id)[-1]
    assert rerun["type"] == "done" and rerun["worker"] == WORKER_ID
    assert usage_record(rds, unstarted.request_id).status == "length"
    wait_until(lambda: rds.xlen(queue) == 0, 10, "the reclaimed entries to leave the queue")


def test_a_dead_workers_n_request_that_streamed_ends_billed_and_one_that_did_not_reruns(
    gpu_worker, rds
):
    # n > 1 is not resumed (its stream interleaves the choices): once it streamed, the taking
    # worker ends it with worker_lost, billed what was delivered; unstarted, it runs again.
    queue = p.queue_key("interactive")
    streamed, unstarted = queued_request(max_tokens=4, n=2), queued_request(max_tokens=4, n=2)
    first = {"type": "delta", "text": "ab", "worker": "w-dead", "completion_tokens": 3}
    first |= {"token_ids": [7, 8, 9], "cached_tokens": 0, "index": 0}
    pipe = rds.pipeline(transaction=True)
    for queued in (streamed, unstarted):
        pipe.xadd(queue, {"r": queued.encode()})
    pipe.xreadgroup(p.GROUP, "w-dead", {queue: ">"}, count=2)
    pipe.execute()
    rds.xadd(p.output_key(streamed.request_id), encode_event(first))

    ended = events(rds, streamed.request_id)[-1]
    assert ended["type"] == "error" and ended["code"] == "worker_lost"
    record = usage_record(rds, streamed.request_id)
    assert record.counts["completion_tokens"] == 3
    assert len(records_of(rds, streamed.request_id)) == 1

    done = events(rds, unstarted.request_id)[-1]
    assert done["type"] == "done" and done["finish_reasons"] == ["length", "length"]
    assert usage_record(rds, unstarted.request_id).counts["completion_tokens"] == 8
    wait_until(lambda: rds.xlen(queue) == 0, 10, "the reclaimed entries to leave the queue")


@pytest.mark.parametrize(
    "raw", ["not json", '{"request_id": "x"}', "[1, 2]", '{"sampling": 3}'], ids=str
)
def test_a_malformed_queue_entry_is_dropped_and_the_worker_goes_on(gpu_worker, rds, raw):
    # An entry admission did not write (a hand-made XADD): nobody waits on it, nothing to bill.
    queue = p.queue_key("interactive")
    bad = rds.xadd(queue, {"r": raw})
    queued = queued_request(max_tokens=3)
    submit(rds, queued)
    assert events(rds, queued.request_id)[-1]["type"] == "done"
    wait_until(lambda: not rds.xrange(queue, bad, bad), 30, "the malformed entry to go")
    assert rds.exists(p.alive_key(WORKER_ID))


def test_a_worker_with_a_step_time_target_prices_its_turns_from_the_start(services):
    # The engine's start-up calibration (engine/runner/step_calibration.py) seeds the worker's
    # turn prices too: priced before its first turn, documents' costs pinned as the engine's.
    settings = SETTINGS.model_copy(update={"step_time_target_s": 0.04})
    from workers.gpu.worker import GpuWorker

    worker = GpuWorker(settings, services.redis_url, "w-calibrated")
    try:
        report = worker.engine.calibration_report
        assert report and report["steps"] >= 10 and len(report["samples"]) == report["steps"]
        assert worker.prices.fitted
        plain = GpuWorker(SETTINGS, services.redis_url, "w-plain")
        assert not plain.prices.fitted  # no target: no calibration, priced after its turns
        plain.engine.shutdown()
    finally:
        worker.engine.shutdown()
