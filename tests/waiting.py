# Waiting on a condition with a generous bound, never a fixed sleep.
from __future__ import annotations

import time


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.05):
    """The predicate's first truthy value; AssertionError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
