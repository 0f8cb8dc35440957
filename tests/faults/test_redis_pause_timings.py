# Redis paused with the default 5 s Redis timeout (the other outage tests shorten it to 1 s):
# a Redis command then hangs for the whole timeout, and neither a stream's keep-alives nor a new
# request's 503 may wait on it. Streams hear a keep-alive every FLEETLM_SSE_KEEPALIVE_S all
# through the pause and finish whole; a request sent meanwhile gets its 503 within the timeout.
from __future__ import annotations

import itertools
import time

import pytest

from tests.faults.conftest import (
    KEEPALIVE_S,
    check_billing,
    complete,
    completion_body,
    fault_server,
    join_all,
    paused,
    redis_pid,
    start_streams,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(240)

REDIS_TIMEOUT_S = 5.0
PAUSE_S = 8.0
# A keep-alive may be late by a loaded 2-core machine's scheduling, never by a Redis timeout.
LATE_S = 1.5


def test_keepalives_and_503s_keep_their_timings_while_redis_is_paused(tmp_path_factory):
    server = fault_server(
        tmp_path_factory, "redis-pause", workers=None, FLEETLM_REDIS_TIMEOUT_S=str(REDIS_TIMEOUT_S)
    )
    try:
        threads, logs = start_streams(server, [completion_body(600) for _ in range(3)])
        wait_until(lambda: all(lg.num_chunks >= 5 for lg in logs), 60, "every stream to start")
        with paused([redis_pid(server)]):
            started = time.monotonic()
            refused = complete(server, completion_body(8), timeout_s=30)
            time.sleep(max(0.0, PAUSE_S - (time.monotonic() - started)))  # the pause itself
            ended = time.monotonic()
        join_all(threads)

        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "redis_unavailable"
        assert refused.elapsed_s <= REDIS_TIMEOUT_S + LATE_S, refused.elapsed_s
        gaps = []
        for lg in logs:
            assert lg.ended_properly and lg.finish_reason == "length", lg
            during = [t for t in lg.times if started <= t <= ended]
            stamps = [started, *during, ended]
            gaps.append(max(b - a for a, b in itertools.pairwise(stamps)))
        assert max(gaps) <= KEEPALIVE_S + LATE_S, gaps
        check_billing(server, logs)
        print(
            f"redis paused {PAUSE_S:.0f}s (5 s timeout): 503 after {refused.elapsed_s:.2f}s; "
            f"longest silence on a stream during the pause {max(gaps):.2f}s"
        )
    finally:
        rc = server.stop()
    assert rc == 0, server.log()
