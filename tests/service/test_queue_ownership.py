# Fencing on queue-entry ownership (service/queue_ownership.py), on the real Redis: once another
# worker has claimed an entry, the worker that lost it can no longer finish the request (no
# second usage record, no release), hand it back, or keep its entry fresh (the heartbeat reports
# it lost); a takeover reads the stream and appends its resume event in one step.
from __future__ import annotations

import json
import time
import uuid

import pytest

from engine.usage import RequestUsage
from metering.records import METERING_STREAM, RequestRecord
from service import streams as p
from service.events import decode_event, encode_event
from service.queue_ownership import finish_call, heartbeat_call, requeue_call, takeover_call
from tests.wire import queued_request

QUEUE = "fleetlm:q:ownership-test"


@pytest.fixture
def entry(rds):
    """A request read by consumer `old`, then claimed by `new` (as XAUTOCLAIM does)."""
    rds.delete(QUEUE)
    rds.xgroup_create(QUEUE, p.GROUP, id="0", mkstream=True)
    queued = queued_request()
    entry_id = rds.xadd(QUEUE, {"r": queued.encode()})
    rds.xreadgroup(p.GROUP, "old", {QUEUE: ">"})
    yield queued, entry_id
    rds.delete(QUEUE, p.output_key(queued.request_id))


def record(queued, worker: str) -> RequestRecord:
    now = time.time()
    return RequestRecord(
        request_id=queued.request_id, tenant_id=queued.tenant_id, key_id=queued.key_id,
        model="tiny", priority="interactive", endpoint="completions", batch_id=None,
        status="length", finish_reason="length", error=None, counts=RequestUsage().to_json(),
        queue_ms=None, ttft_ms=None, tpot_ms=None, e2e_ms=None, worker_id=worker,
        enqueued_at=now, finished_at=now,
    )  # fmt: skip


def records_of(rds, request_id: str) -> list[dict]:
    found = [json.loads(f["r"]) for _, f in rds.xrange(METERING_STREAM) if "r" in f]
    return [r for r in found if r.get("request_id") == request_id]


def done(worker: str) -> dict:
    return {"type": "done", "text": "", "worker": worker, "finish_reason": "length",
            "usage": RequestUsage().to_json()}  # fmt: skip


def test_only_the_owner_finishes_a_request(rds, entry):
    queued, entry_id = entry
    rds.xclaim(QUEUE, p.GROUP, "new", 0, [entry_id])
    lost = finish_call(queued, QUEUE, entry_id, "old", done("old"), 60, record(queued, "old"))
    assert rds.eval(*lost) == 0
    assert not rds.exists(p.output_key(queued.request_id))
    assert records_of(rds, queued.request_id) == []
    assert rds.xpending(QUEUE, p.GROUP)["pending"] == 1

    won = finish_call(queued, QUEUE, entry_id, "new", done("new"), 60, record(queued, "new"))
    assert rds.eval(*won) == 1
    assert rds.eval(*won) == 0  # a retried round trip: once
    assert [r["worker_id"] for r in records_of(rds, queued.request_id)] == ["new"]
    assert rds.xpending(QUEUE, p.GROUP)["pending"] == 0 and rds.xlen(QUEUE) == 0


def test_only_the_owner_hands_a_request_back(rds, entry):
    queued, entry_id = entry
    rds.xclaim(QUEUE, p.GROUP, "new", 0, [entry_id])
    assert rds.eval(*requeue_call(queued, QUEUE, entry_id, "old")) == 0
    assert rds.xlen(QUEUE) == 1  # not duplicated


def test_the_heartbeat_keeps_its_own_entries_and_reports_lost_ones(rds, entry):
    _, entry_id = entry
    worker = f"old-{uuid.uuid4().hex[:6]}"
    rds.xclaim(QUEUE, p.GROUP, worker, 0, [entry_id])
    beat = heartbeat_call(worker, {"pid": 1}, 5000, [(QUEUE, entry_id)], queues=[QUEUE])
    assert rds.eval(*beat) == []
    assert rds.pttl(p.alive_key(worker)) > 0
    rds.xclaim(QUEUE, p.GROUP, "new", 0, [entry_id])
    assert rds.eval(*beat) == [entry_id]
    rds.delete(p.alive_key(worker))
    rds.srem(p.WORKERS_SET, worker)


def test_a_takeover_reads_the_stream_and_appends_its_resume_event(rds, entry):
    queued, _ = entry
    key = p.output_key(queued.request_id)
    first = {"type": "delta", "text": "a", "worker": "old", "completion_tokens": 1,
             "token_ids": [5]}  # fmt: skip
    rds.xadd(key, encode_event(first))
    events, cancel = rds.eval(*takeover_call(queued.request_id, "new", 60))
    assert cancel is None and len(events) == 1
    stream = [decode_event(f) for _, f in rds.xrange(key)]
    assert stream == [first, {"type": "resume", "worker": "new"}]
    assert 0 < rds.ttl(key) <= 60
