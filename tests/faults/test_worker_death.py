# A worker killed with SIGKILL mid-stream while another worker is live: its streams continue on
# the other worker (a takeover re-runs prompt + tokens already sent), so each client sees neither
# an error nor a repeated token, the text is the uninterrupted run's (greedy and seeded alike),
# and each request is billed once for what was delivered.
from __future__ import annotations

import os
import signal
import time

import pytest

from service.events import decode_event
from tests.faults.conftest import (
    LIVENESS_BOUND_S,
    SLACK_S,
    check_billing,
    complete,
    completion_body,
    ensure_workers,
    join_all,
    start_streams,
    worker_pid,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(240)

MAX_TOKENS = 600


SEEDED = {"temperature": 0.8, "top_p": 0.95, "seed": 1234}


def uninterrupted(server, max_tokens: int, **sampling) -> str:
    r = complete(server, completion_body(max_tokens, **sampling), timeout_s=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_a_killed_workers_streams_resume_on_the_other_worker(fleet):
    ensure_workers(fleet, 2)
    # Two greedy streams and two seeded ones: both must continue exactly.
    bodies = [completion_body(MAX_TOKENS, **(SEEDED if i % 2 else {})) for i in range(4)]
    threads, logs = start_streams(fleet, bodies)
    wait_until(lambda: all(lg.num_chunks >= 10 for lg in logs), 60, "every stream to start")
    # The worker streaming the first seeded request (its deltas say which).
    first = decode_event(fleet.redis.xrange(f"fleetlm:out:{logs[1].request_id}", count=1)[0][1])
    victim = first["worker"]
    os.kill(worker_pid(fleet, victim), signal.SIGKILL)
    killed_at = time.time()
    join_all(threads)

    for lg in logs:
        assert lg.exception is None and lg.status == 200, lg
        assert lg.ended_properly and lg.error is None and lg.finish_reason == "length", lg
        assert lg.max_gap_s() <= LIVENESS_BOUND_S + SLACK_S, lg.max_gap_s()
    taken_over, resumed_after = [], []
    for lg in logs:
        stream = fleet.redis.xrange(f"fleetlm:out:{lg.request_id}")
        resumed = [i for i, (_, f) in enumerate(stream) if decode_event(f)["type"] == "resume"]
        if resumed:
            taken_over.append(lg)
            # The first delta of the worker that took over, by its stream entry's time (ms).
            entry_id = stream[resumed[0] + 1][0]
            resumed_after.append(int(entry_id.split("-")[0]) / 1000 - killed_at)
    assert logs[1] in taken_over
    greedy, seeded = uninterrupted(fleet, MAX_TOKENS), uninterrupted(fleet, MAX_TOKENS, **SEEDED)
    assert greedy != seeded
    for i, lg in enumerate(logs):
        assert lg.text == (seeded if i % 2 else greedy), lg.request_id
    gaps = [lg.max_gap_s() for lg in logs]
    print(
        f"worker death: {len(taken_over)} of {len(logs)} streams taken over, their first new "
        f"token {max(resumed_after):.1f}s after the kill at most; longest silence "
        f"{max(gaps):.1f}s with keep-alives (liveness bound {LIVENESS_BOUND_S:.2f}s)"
    )
    assert max(resumed_after) <= LIVENESS_BOUND_S + SLACK_S
    rows = check_billing(fleet, logs)
    for lg in taken_over:
        row = rows[lg.request_id]
        assert row.status == "length" and row.completion_tokens == MAX_TOKENS
        assert row.worker_id != victim
        # Timed from the first token the client saw (the first run's), not the resumed run's;
        # the client's clock started before admission, so it saw the token no sooner.
        client_ttft_s = lg.times[lg.kinds.index("chunk")] - lg.started
        assert row.ttft_ms / 1000 <= client_ttft_s + 0.5, (row.ttft_ms, client_ttft_s)
        assert row.tpot_ms * (MAX_TOKENS - 1) == pytest.approx(row.e2e_ms - row.ttft_ms, rel=0.01)
