# Graceful drain of an API process. SIGTERM (fleetlm/api_cmd.py) starts it: /ready turns 503,
# new generation requests get an OpenAI-shaped 503 with Retry-After, open requests keep relaying.
# The server is told to exit once none is open (and at least drain_delay_s has passed, so load
# balancers see /ready fail first). Requests still open at drain_timeout_s (plus a moment, so
# workers draining beside this API end theirs first, with their own events) are ended by their
# relays with a `shutdown` error event and a cancel to the worker; the server exits right after.
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from api.metrics import DRAINING, OPEN_REQUESTS
from service.errors import APIError

RELAY_GRACE_S = 1.0  # after drain_timeout_s: relays end what is still open
EXIT_GRACE_S = 2.0  # after that: exit whatever is still open (the relays' errors are out)


class Drain:
    def __init__(self, delay_s: float, timeout_s: float) -> None:
        self.delay_s, self.timeout_s = delay_s, timeout_s
        self.started_at: float | None = None
        self.open = 0  # generation requests admitted and not yet finished relaying

    @property
    def draining(self) -> bool:
        return self.started_at is not None

    def deadline_passed(self) -> bool:
        started = self.started_at
        return started is not None and time.monotonic() - started > self.timeout_s + RELAY_GRACE_S

    def check(self) -> None:
        if self.draining:
            raise APIError(
                503,
                "The server is shutting down; retry the request.",
                type="server_error",
                code="server_draining",
                headers={"Retry-After": "1"},
            )

    def opened(self) -> None:
        self.open += 1
        OPEN_REQUESTS.inc()

    def closed(self) -> None:
        self.open -= 1
        OPEN_REQUESTS.dec()

    def start(self, then: Callable[[], None]) -> None:
        """Signal-handler safe: flips the flag, then a thread waits and calls `then`."""
        if self.draining:
            return
        self.started_at = time.monotonic()
        DRAINING.set(1)
        threading.Thread(target=self._wait, args=(then,), name="drain", daemon=True).start()

    def _wait(self, then: Callable[[], None]) -> None:
        assert self.started_at is not None
        while True:
            elapsed = time.monotonic() - self.started_at
            hard = self.timeout_s + RELAY_GRACE_S + EXIT_GRACE_S
            if elapsed >= hard or (self.open <= 0 and elapsed >= self.delay_s):
                break
            time.sleep(0.05)
        then()
