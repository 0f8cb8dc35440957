# Postgres stopped (every Postgres process SIGSTOPped: connections hang, which is worse than
# refused) for 30 s: serving goes on for keys the API verified before, from its bounded stale
# key cache; a key it never verified gets 503 with Retry-After, quickly; /ready stays ready
# (reporting the database); the usage records wait in Redis and are all written once Postgres
# is back.
from __future__ import annotations

import signal
import time

import httpx
import psutil
import pytest

from tests.faults.conftest import (
    SLACK_S,
    StreamLog,
    check_billing,
    complete,
    completion_body,
    ensure_workers,
    postgres_processes,
    signal_all,
    stream_completion,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(240)

STOP_S = 30.0
DATABASE_TIMEOUT_S = 1.0  # FAULT_ENV's FLEETLM_DATABASE_TIMEOUT_S


def test_serving_rides_out_postgres_stopped_30s(fleet):
    ensure_workers(fleet, 2)
    never_used_key = fleet.create_tenant(f"pg-{time.monotonic_ns()}")
    warm = stream_completion(fleet, completion_body(8), StreamLog())
    assert warm.status == 200 and warm.ended_properly  # the demo key is verified and cached

    logs: list[StreamLog] = [warm]
    refusals: list[tuple[httpx.Response, float]] = []
    readiness: list[httpx.Response] = []
    processes = postgres_processes(fleet)
    signal_all(processes, signal.SIGSTOP)
    try:
        stopped_at = time.monotonic()
        while time.monotonic() < stopped_at + STOP_S:
            logs.append(stream_completion(fleet, completion_body(32), StreamLog(), timeout_s=30))
            r = complete(fleet, completion_body(8), key=never_used_key, timeout_s=30)
            refusals.append((r, r.elapsed_s))
            readiness.append(httpx.get(fleet.base_url + "/ready", timeout=30))
    finally:
        signal_all(processes, signal.SIGCONT)

    assert len(logs) > 5
    for lg in logs:
        assert lg.status == 200 and lg.ended_properly and lg.finish_reason == "length", lg
    for r, elapsed in refusals:
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "database_unavailable"
        assert int(r.headers["retry-after"]) >= 1
        assert elapsed <= DATABASE_TIMEOUT_S + SLACK_S
    for r in readiness:
        assert r.status_code == 200 and r.json()["database"] is False, r.text
    # Metering catches up: one row per request, billing what each client received.
    resumed_at = time.monotonic()
    check_billing(fleet, logs, timeout_s=90)
    print(
        f"postgres stopped {STOP_S:.0f}s: {len(logs) - 1} requests served with cached keys, "
        f"{len(refusals)} unknown-key requests refused (503) in "
        f"{max(e for _, e in refusals):.1f}s at most; metering caught up "
        f"{time.monotonic() - resumed_at:.1f}s after it came back"
    )

    # A key first seen now is looked up in Postgres again. A lookup the outage left pending may
    # still end in an error (503 with Retry-After, as during the outage); a client that retries
    # is let in within a bound.
    def late_accepted():
        late = complete(fleet, completion_body(4), key=never_used_key)
        assert late.status_code in (200, 503), late.text
        return late.status_code == 200

    wait_until(late_accepted, 30, "a never-used key accepted after Postgres came back", 0.5)


def test_a_killed_postgres_is_restarted_and_metering_catches_up(fleet):
    ensure_workers(fleet, 2)
    warm = stream_completion(fleet, completion_body(8), StreamLog())
    assert warm.status == 200  # the demo key is verified and cached
    (postmaster, *_) = postgres_processes(fleet)
    postmaster.kill()  # SIGKILL: `fleetlm serve` restarts it from its data directory

    def restarted():
        try:
            return postgres_processes(fleet)[0].pid != postmaster.pid
        except (OSError, ValueError, IndexError, psutil.Error):
            return False

    logs = [warm, stream_completion(fleet, completion_body(16), StreamLog(), timeout_s=30)]
    wait_until(restarted, 60, "fleetlm serve to restart Postgres", 0.2)
    logs.append(stream_completion(fleet, completion_body(16), StreamLog(), timeout_s=30))
    for lg in logs:
        assert lg.status == 200 and lg.ended_properly and lg.finish_reason == "length", lg
    check_billing(fleet, logs, timeout_s=90)
    fresh = fleet.create_tenant(f"pg-restart-{time.monotonic_ns()}")
    r = complete(fleet, completion_body(4), key=fresh)
    assert r.status_code == 200, r.text
