# What `fleetlm serve` says while it comes up, so a first start that takes a minute never looks
# hung: one line per part as it is up (Redis, Postgres, migrations, the API, Celery), then one
# "ready" line once a worker is live — the API's /ready, the thing a client should wait for. The
# lines go to stdout; the children log to stderr.
from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

READY_POLL_S = 0.5
SLOW_READY_S = 120.0  # past this without a live worker, say so once


def say(line: str) -> None:
    print(f"fleetlm: {line}", flush=True)


@contextmanager
def part(what: str, done: str = "up") -> Iterator[None]:
    """`fleetlm: <what> … up in 1.2s` on one line: the start of a slow step shows at once. Only
    for the steps before any child runs, whose output could land inside the line."""
    print(f"fleetlm: {what} …", end="", flush=True)
    t0 = time.monotonic()
    try:
        yield
    except BaseException:
        print(" failed", flush=True)
        raise
    print(f" {done} in {time.monotonic() - t0:.1f}s", flush=True)


def live_workers(base_url: str) -> int | None:
    """The live workers /ready counts, or None while it is not ready (or not answering)."""
    try:
        with urllib.request.urlopen(base_url + "/ready", timeout=1) as r:
            return int(json.load(r).get("workers") or 0) if r.status == 200 else None
    except (OSError, ValueError):
        return None


@dataclass
class Milestone:
    check: Callable[[], str | None]  # the line to print once it is reached, else None
    every_s: float = 0.0
    next_at: float = 0.0


@dataclass
class Milestones:
    """Checked from the supervisor's loop (non-blocking): each prints its line once."""

    pending: list[Milestone] = field(default_factory=list)

    def poll(self) -> None:
        now = time.monotonic()
        for m in list(self.pending):
            if now < m.next_at:
                continue
            m.next_at = now + m.every_s
            line = m.check()
            if line is not None:
                say(line)
                self.pending.remove(m)


def celery_up(pidfiles: list[Path]) -> Milestone:
    def check() -> str | None:
        up = all(p.exists() for p in pidfiles)
        return "Celery worker and beat up (batch jobs)" if up else None

    return Milestone(check, every_s=0.5)


def ready(base_url: str) -> Milestone:
    """The ready line; and one line if no worker is live after SLOW_READY_S (a model still
    loading, or a worker failing)."""
    since = time.monotonic()
    slow_said = False

    def check() -> str | None:
        nonlocal slow_said
        n = live_workers(base_url)
        if n is not None:
            return f"ready: {n} worker(s) live ({base_url}/ready answers 200); Ctrl-C stops"
        if not slow_said and time.monotonic() - since > SLOW_READY_S:
            slow_said = True
            say(f"no worker live after {SLOW_READY_S:.0f}s; the worker's lines above say why")
        return None

    return Milestone(check, every_s=READY_POLL_S)
