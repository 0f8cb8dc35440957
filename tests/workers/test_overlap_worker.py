# The GPU worker with overlapped scheduling (engine/runner/overlap.py): its loop drives the engine's
# schedule / launch / step_done / finish split unchanged, so a request streams to its end and a
# cancel stops it, with the tokens streamed exactly the tokens billed. The package's worker is
# switched to the mode while idle and back afterwards.
from __future__ import annotations

import pytest

from service import streams as p
from tests.waiting import wait_until
from tests.wire import queued_request
from tests.workers.conftest import events, submit, usage_record, worker_stats

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def overlapped(gpu_worker):
    engine = gpu_worker.engine
    wait_until(lambda: not engine.has_unfinished(), 30, "the worker to be idle")
    engine.set_overlap_scheduling(True)
    yield engine
    wait_until(lambda: not engine.has_unfinished(), 30, "the worker to be idle")
    engine.set_overlap_scheduling(False)


def _streamed(got) -> list[int]:
    return [t for e in got if e["type"] == "delta" for t in e["token_ids"]]


def test_a_request_streams_to_its_end(overlapped, rds):
    queued = queued_request(max_tokens=12)
    submit(rds, queued)
    got = events(rds, queued.request_id)
    done = got[-1]
    assert done["type"] == "done" and done["finish_reason"] == "length"
    assert done["usage"]["completion_tokens"] == 12
    assert len(_streamed(got)) == 11  # the last token's text rides on the done event
    assert usage_record(rds, queued.request_id).counts == done["usage"]
    assert overlapped.overlap.num_overlapped > 0


def test_a_cancel_bills_what_was_streamed(overlapped, rds):
    queued = queued_request(max_tokens=2000)
    submit(rds, queued)
    wait_until(lambda: rds.xlen(p.output_key(queued.request_id)), 60, "the first delta")
    rds.set(p.cancel_key(queued.request_id), "1")
    got = events(rds, queued.request_id)
    final = got[-1]
    assert final["type"] == "error" and final["code"] == "cancelled"
    record = usage_record(rds, queued.request_id)
    assert 1 <= record.counts["completion_tokens"] < 2000
    assert len(_streamed(got)) == record.counts["completion_tokens"]

    def idle():
        stats = worker_stats(rds)
        return stats["num_free_blocks"] == stats["num_total_blocks"] and stats["num_running"] == "0"

    wait_until(idle, 10, "the KV blocks to be free")
