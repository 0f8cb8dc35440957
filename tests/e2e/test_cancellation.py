# A client that goes away cancels its request: the worker aborts it and its KV blocks are free
# at the next engine step.
from __future__ import annotations

import time

import httpx
import pytest

from tests.e2e.conftest import wait_until

pytestmark = pytest.mark.timeout(90)

MESSAGES = [{"role": "user", "content": "Tell me a very long story. " * 8}]


def the_worker(server) -> dict:
    (worker,) = server.workers_stats()
    return worker


def test_stream_disconnect_frees_blocks_within_one_step(server):
    idle = the_worker(server)
    assert idle["num_free_blocks"] == idle["num_total_blocks"]
    stream = server.openai().chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=3000, stream=True
    )
    chunks = []
    for chunk in stream:
        chunks.append(chunk)
        if len(chunks) == 5:
            break
    busy = the_worker(server)
    assert busy["num_free_blocks"] < busy["num_total_blocks"]
    assert busy["num_running"] == 1
    stream.close()
    closed_at = time.monotonic()

    def idle_again():
        w = the_worker(server)
        return w if w["num_free_blocks"] == w["num_total_blocks"] else None

    after = wait_until(idle_again, 10, "the worker's free blocks to return to idle")
    assert time.monotonic() - closed_at < 5
    # The abort freed the blocks right after the step that saw the cancel; the next step
    # (the one that reports the abort) already shows them free.
    assert after["last_cancel_step"] >= 0
    assert after["step"] - after["last_cancel_step"] <= 1
    assert after["num_running"] == 0 and after["num_waiting"] == 0
    record = server.usage_record(chunks[0].id)
    assert record.status == "cancelled"
    assert record.finish_reason == "abort"
    assert 1 <= record.counts["completion_tokens"] < 3000


def test_non_stream_disconnect_cancels(server):
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 3000}
    headers = {"Authorization": f"Bearer {server.key}"}
    before = {r.request_id for r in server.usage_records()}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            server.base_url + "/v1/chat/completions",
            json=body,
            headers=headers,
            timeout=httpx.Timeout(10, read=1.5),
        )

    def cancelled_record():
        for r in server.usage_records():
            if r.request_id not in before and r.status == "cancelled":
                return r
        return None

    record = wait_until(cancelled_record, 10, "a cancelled usage record")
    assert record.counts["completion_tokens"] < 3000
    w = wait_until(
        lambda: (w := the_worker(server))["num_free_blocks"] == w["num_total_blocks"] and w,
        10,
        "free blocks back to idle",
    )
    assert w["num_running"] == 0
