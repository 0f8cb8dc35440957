# A GPU worker's view of a Redis outage: since when Redis has taken no round trip, whether the
# worker has ended its requests for it (past redis_outage_s: workers/gpu/request_ends.py), and the
# back-off between its retries. The round trip marks it; the step loop pauses while it lasts.
from __future__ import annotations

import time

from service.redis_clients import Backoff


class RedisOutage:
    def __init__(self) -> None:
        self.since: float | None = None  # monotonic
        self.requests_ended = False
        self.backoff = Backoff()

    @property
    def active(self) -> bool:
        return self.since is not None

    def began(self) -> bool:
        """A round trip failed: True when this starts an outage."""
        if self.since is not None:
            return False
        self.since = time.monotonic()
        return True

    def lasted(self) -> float:
        return time.monotonic() - self.since if self.since is not None else 0.0

    def over(self) -> bool:
        """A round trip got through: True when that ends an outage (which is then forgotten)."""
        if self.since is None:
            return False
        self.since, self.requests_ended = None, False
        self.backoff.reset()
        return True
