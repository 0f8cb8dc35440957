# Queues and workers under failure: a full queue, two workers draining one queue, and a worker
# killed with SIGKILL mid-stream (its stream resumes on the other worker and its queued requests
# run there; with no other worker, an explicit error, no hang). More in tests/faults/.
# This module runs `fleetlm serve --workers 0` and starts `fleetlm worker` processes itself.
from __future__ import annotations

import os
import signal
import threading
import time

import openai
import pytest

from tests.e2e.conftest import start_server, wait_until

pytestmark = pytest.mark.timeout(120)

MAX_QUEUE = 6
DEAD_AFTER_S = 3.0  # conftest's FLEETLM_WORKER_DEAD_AFTER_S
NO_WORKER_TIMEOUT_S = 2.0  # conftest's FLEETLM_NO_WORKER_TIMEOUT_S
MESSAGES = [{"role": "user", "content": "Count to one hundred."}]
GREEDY = {"temperature": 0, "ignore_eos": True}  # never stops before max_tokens


@pytest.fixture(scope="module")
def qserver(tmp_path_factory):
    srv = start_server(
        tmp_path_factory.mktemp("liveness") / "data",
        workers=0,
        env={"FLEETLM_MAX_QUEUE_LEN": str(MAX_QUEUE)},
    )
    yield srv
    rc = srv.stop()
    assert rc == 0, f"fleetlm serve exited {rc} on SIGTERM:\n{srv.log()}"


def run_in_threads(fn, n: int) -> tuple[list[threading.Thread], list]:
    results: list = [None] * n

    def target(i: int) -> None:
        try:
            results[i] = fn(i)
        except Exception as exc:  # collected and asserted on by the test
            results[i] = exc

    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return threads, results


def live_worker_ids(server) -> set[str]:
    return {w["id"] for w in server.workers_stats()}


def stop_workers(server) -> None:
    for proc in server.workers:
        if proc.poll() is None:
            proc.terminate()
    for proc in server.workers:
        proc.wait(timeout=20)
    server.workers.clear()
    wait_until(lambda: not live_worker_ids(server), 10, "no live workers")


def test_queue_full_is_503_with_retry_after_and_queued_requests_fail_without_workers(qserver):
    client = qserver.openai(timeout=30)
    chat = lambda i: client.chat.completions.create(  # noqa: E731
        model="tiny", messages=MESSAGES, max_tokens=4
    )
    threads, results = run_in_threads(chat, MAX_QUEUE)
    wait_until(lambda: qserver.redis.xlen("fleetlm:q:interactive") == MAX_QUEUE, 10, "a full queue")
    with pytest.raises(openai.InternalServerError) as exc:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4)
    assert exc.value.status_code == 503
    assert exc.value.response.headers["retry-after"] == "1"
    assert exc.value.body["code"] == "queue_full"
    # Nobody can run them: each ends with an explicit error within the liveness bound.
    start = time.monotonic()
    for t in threads:
        t.join(timeout=NO_WORKER_TIMEOUT_S + 10)
    assert time.monotonic() - start < NO_WORKER_TIMEOUT_S + 5
    for r in results:
        assert isinstance(r, openai.InternalServerError), r
        assert r.status_code == 503 and r.body["code"] == "no_workers"


def test_two_workers_drain_one_queue(qserver):
    small = {
        "FLEETLM_MAX_NUM_SEQS": "2",
        "FLEETLM_WORKER_MAX_WAITING": "1",
        "FLEETLM_WORKER_MAX_HELD": "1",
    }
    qserver.start_worker(small)
    qserver.start_worker(small)
    wait_until(lambda: len(live_worker_ids(qserver)) == 2, 60, "two live workers", 0.2)
    # The requests the previous test abandoned are dropped (cancelled) by the workers.
    wait_until(lambda: qserver.redis.xlen("fleetlm:q:interactive") == 0, 30, "an empty queue")

    client = qserver.openai(timeout=60)
    n = MAX_QUEUE
    chat = lambda i: client.chat.completions.create(  # noqa: E731
        model="tiny", messages=MESSAGES, max_tokens=48
    )
    threads, results = run_in_threads(chat, n)
    for t in threads:
        t.join(timeout=60)
    assert all(isinstance(r, openai.types.chat.ChatCompletion) for r in results), results
    records = [qserver.usage_record(r.id) for r in results]
    assert {rec.status for rec in records} == {"length"}
    assert len({rec.worker_id for rec in records}) == 2, "both workers should have served"
    stop_workers(qserver)


def test_sigkill_mid_stream_resumes_elsewhere_and_queued_requests_survive(qserver):
    # It holds what it cannot start yet in its engine's waiting queue (FLEETLM_WORKER_MAX_HELD).
    victim = qserver.start_worker(
        {
            "FLEETLM_MAX_NUM_SEQS": "1",
            "FLEETLM_WORKER_MAX_WAITING": "4",
            "FLEETLM_WORKER_MAX_HELD": "4",
        }
    )
    wait_until(lambda: len(live_worker_ids(qserver)) == 1, 60, "the worker", 0.2)
    (victim_id,) = live_worker_ids(qserver)
    client = qserver.openai(timeout=60)

    stream = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=3000, stream=True, extra_body=GREEDY
    )
    it = iter(stream)
    first = [next(it) for _ in range(3)]
    stream_id = first[0].id

    chat = lambda i: client.chat.completions.create(  # noqa: E731
        model="tiny", messages=MESSAGES, max_tokens=8
    )
    threads, results = run_in_threads(chat, 3)
    wait_until(
        lambda: qserver.workers_stats()[0]["num_waiting"] == 3, 20, "3 requests waiting", 0.1
    )
    # The survivor is up before the kill: it can only get the victim's requests by XAUTOCLAIM.
    qserver.start_worker()
    wait_until(lambda: len(live_worker_ids(qserver)) == 2, 60, "the second worker", 0.2)

    os.kill(victim.pid, signal.SIGKILL)
    # The stream goes on on the survivor, to its end (its text is checked against an
    # uninterrupted run in tests/faults/test_worker_death.py).
    rest = list(it)
    assert rest[-1].choices[0].finish_reason == "length"

    for t in threads:
        t.join(timeout=60)
    assert all(isinstance(r, openai.types.chat.ChatCompletion) for r in results), results
    for r in results:
        assert r.choices[0].finish_reason == "length"
        record = qserver.usage_record(r.id)
        assert record.worker_id != victim_id and record.status == "length"
    resumed = qserver.usage_record(stream_id)
    assert resumed.status == "length" and resumed.worker_id != victim_id
    assert resumed.counts["completion_tokens"] == 3000
    stop_workers(qserver)


def test_sigkill_with_no_other_worker_fails_the_stream_explicitly(qserver):
    victim = qserver.start_worker()
    wait_until(lambda: len(live_worker_ids(qserver)) == 1, 60, "the worker", 0.2)
    client = qserver.openai(timeout=60)
    stream = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=3000, stream=True
    )
    it = iter(stream)
    for _ in range(3):
        next(it)
    os.kill(victim.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    with pytest.raises(openai.APIError) as exc:
        for _ in it:
            pass
    waited = time.monotonic() - killed_at
    assert "stopped" in str(exc.value.message)
    # Bound: DEAD_AFTER_S + NO_WORKER_TIMEOUT_S + relay poll; slack for a loaded 2-core machine.
    assert waited < DEAD_AFTER_S + NO_WORKER_TIMEOUT_S + 6, f"the error came {waited:.1f}s after"
    qserver.workers.clear()
