# Redis paused (SIGSTOP) for 10 s, then Redis killed (SIGKILL, which `fleetlm serve` restarts on
# the same port from its append-only file): open streams ride it out and finish whole (the
# workers pause their engines and publish what waited when Redis answers again), clients hear a
# keep-alive at least every few seconds meanwhile, requests sent during the outage get 503 with
# Retry-After (never a 500), and metering stays exact.
from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from tests.faults.conftest import (
    KEEPALIVE_S,
    LIVENESS_BOUND_S,
    REDIS_TIMEOUT_S,
    SLACK_S,
    check_billing,
    complete,
    completion_body,
    ensure_workers,
    join_all,
    paused,
    redis_pid,
    start_streams,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(240)

PAUSE_S = 10.0
MAX_TOKENS = 800


def refused_while_away(server, until: float) -> list[httpx.Response]:
    """New requests while Redis is away, one after another until `until` (monotonic)."""
    refused = []
    while time.monotonic() < until:
        refused.append(complete(server, completion_body(8), timeout_s=30))
    return refused


def check_streams_survived(logs) -> None:
    for lg in logs:
        assert lg.exception is None and lg.status == 200, lg
        assert lg.ended_properly and lg.error is None and lg.finish_reason == "length", lg
        # Keep-alives while the relay could not read: no silence past the liveness bound.
        assert lg.max_gap_s() <= LIVENESS_BOUND_S + SLACK_S, lg.max_gap_s()


def test_streams_ride_out_redis_paused_10s(fleet):
    ensure_workers(fleet, 2)
    threads, logs = start_streams(fleet, [completion_body(MAX_TOKENS) for _ in range(4)])
    wait_until(lambda: all(lg.num_chunks >= 5 for lg in logs), 60, "every stream to start")
    pid = redis_pid(fleet)
    with paused([pid]):
        stopped_at = time.monotonic()
        refused = refused_while_away(fleet, stopped_at + PAUSE_S)
        chunks_during = [lg.num_chunks for lg in logs]
    join_all(threads)

    assert refused
    for r in refused:
        assert r.status_code == 503, (r.status_code, r.text)
        assert r.json()["error"]["code"] == "redis_unavailable"
        assert int(r.headers["retry-after"]) >= 1
        assert r.elapsed_s <= REDIS_TIMEOUT_S + SLACK_S
    check_streams_survived(logs)
    for lg, n in zip(logs, chunks_during):
        assert lg.num_chunks > n, "the stream went on after the pause"
        assert "keepalive" in lg.kinds
        assert len(lg.text) > 0
    assert max(b - a for lg in logs for a, b in zip(lg.times, lg.times[1:])) <= KEEPALIVE_S + 3
    assert redis_pid(fleet) == pid
    check_billing(fleet, logs)
    print(
        f"redis paused {PAUSE_S:.0f}s: {len(refused)} requests refused (503) in "
        f"{max(r.elapsed_s for r in refused):.1f}s at most; longest silence on a stream "
        f"{max(lg.max_gap_s() for lg in logs):.1f}s; streams finished whole"
    )


def test_streams_ride_out_redis_killed_and_restarted(fleet):
    ensure_workers(fleet, 2)
    threads, logs = start_streams(fleet, [completion_body(MAX_TOKENS) for _ in range(4)])
    wait_until(lambda: all(lg.num_chunks >= 5 for lg in logs), 60, "every stream to start")
    pid = redis_pid(fleet)
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()

    def restarted():
        try:
            return redis_pid(fleet) != pid
        except Exception:
            return False

    wait_until(restarted, 30, "fleetlm serve to restart Redis", 0.1)
    back_after_s = time.monotonic() - killed_at
    join_all(threads)
    check_streams_survived(logs)
    check_billing(fleet, logs)
    print(
        f"redis killed: back after {back_after_s:.1f}s; longest silence on a stream "
        f"{max(lg.max_gap_s() for lg in logs):.1f}s; streams finished whole"
    )
    assert back_after_s < 10
    assert len(fleet.workers_stats()) == 2, "the workers stayed up"
