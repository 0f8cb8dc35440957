# A revoked key stops working at once, also while Postgres is away: `fleetlm tenants
# revoke-key` pushes the key's hash through Redis to every API process, which checks it before
# its key cache (the cache alone would keep serving a verified key for FLEETLM_API_KEY_STALE_S
# while the database does not answer).
from __future__ import annotations

import signal
import time

import pytest

from tests.faults.conftest import (
    complete,
    completion_body,
    ensure_workers,
    postgres_processes,
    signal_all,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(240)


def test_a_revoked_key_is_refused_at_once_even_with_postgres_stopped(fleet):
    ensure_workers(fleet, 1)
    name = f"revoked-{time.monotonic_ns()}"
    key = fleet.create_tenant(name)
    # Both keys verified and cached (a fleet just started may still shed a first request).
    for k in (key, fleet.key):
        wait_until(
            lambda k=k: complete(fleet, completion_body(4), key=k).status_code == 200, 60, "ok"
        )
    prefix = fleet.cli("tenants", "keys", name).split("…")[0].strip()
    out = fleet.cli("tenants", "revoke-key", prefix)
    processes = postgres_processes(fleet)
    signal_all(processes, signal.SIGSTOP)
    try:
        refused = [complete(fleet, completion_body(4), key=key, timeout_s=30) for _ in range(5)]
        served = complete(fleet, completion_body(4), timeout_s=30)  # the demo key, from cache
    finally:
        signal_all(processes, signal.SIGCONT)
    for r in refused:
        assert r.status_code == 401, (r.status_code, r.text)
        assert r.json()["error"]["code"] == "invalid_api_key"
    assert served.status_code == 200, served.text
    assert "refuses it from now on" in out, out
