# What a worker knows about each request it runs, and what it bills when the request ends some
# other way than the engine finishing it: the tokens it had published to the request's output
# stream, which is what the client got (service/output_stream.py).
from __future__ import annotations

import threading
from dataclasses import dataclass, replace

from engine.usage import RequestUsage
from service.events import ErrorEvent
from service.output_stream import OutputFollower
from service.queued_request import QueuedRequest


@dataclass(slots=True)
class Inflight:
    req: QueuedRequest
    queue: str
    entry_id: str
    published: bool = False  # any output event sent: from then on it can no longer be re-run
    num_events: int = 0  # delta events published (the stream's TTL is refreshed now and then)
    # Completion tokens of the last delta put on a round trip, and of the last one a round trip
    # that succeeded carried (a failed round trip is sent again, so these are positions, not
    # sums).
    sent_tokens: int = 0
    confirmed_tokens: int = 0
    cached_tokens: int | None = None  # resumed: the prompt tokens the first run found cached
    # resumed: the first run's first-token and first-scheduled times (its client saw those)
    first_token_time: float | None = None
    scheduled_time: float | None = None
    cancel_delivered: int | None = None  # the client went away after receiving this many
    # Its API process's lease (workers/gpu/client_leases.py): the tokens it last said the client
    # was sent, and since when (worker clock) the lease has been seen missing.
    lease_delivered: int = 0
    lease_missing_since: float | None = None
    final: ErrorEvent | None = None  # ended by the worker itself (drain, shutdown, outage)

    @property
    def request_id(self) -> str:
        return self.req.request_id

    def usage(self, completion_tokens: int, engine: RequestUsage | None = None) -> dict[str, int]:
        """What to bill, as the final event carries it: the engine's record (if it ran here)
        with `completion_tokens` and the first run's cached tokens."""
        if engine is None:
            engine = RequestUsage(prompt_tokens=len(self.req.prompt_token_ids))
        usage = replace(engine, completion_tokens=completion_tokens)
        if self.cached_tokens is not None:
            usage.cached_tokens = self.cached_tokens
        return usage.to_json()

    def resumed_from(self, follower: OutputFollower) -> None:
        """Taken over after `follower` read the stream: what the first run's client had."""
        self.published = True
        self.sent_tokens = self.confirmed_tokens = follower.num_tokens
        self.cached_tokens = follower.cached_tokens
        self.first_token_time = follower.first_token_time
        self.scheduled_time = follower.scheduled_time


def owned_entries(inflight: dict[str, Inflight], lock: threading.Lock) -> list[tuple[str, str]]:
    """(queue, entry id) of every request in `inflight`, read under `lock` (the heartbeat
    thread reads it while the step loop changes it)."""
    with lock:
        return [(f.queue, f.entry_id) for f in inflight.values()]
