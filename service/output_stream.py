# The rules for reading one request's output stream (fleetlm:out:{id}), shared by everyone who
# reads it: the API's relay, the batch runner, and a worker taking over a request whose worker
# stopped. Two kinds of writer can put events there that a reader must not deliver:
#
# - A worker that lost the request. When a worker is taken for dead, another one claims its
#   queue entry and appends a `resume` event in the same Lua call that read the stream
#   (service/queue_ownership.py). From that event on, the stream belongs to the resuming worker:
#   events of any other worker are stale (a worker that was only cut off from Redis, say) and
#   skipped.
# - A retried round trip. A worker whose pipeline failed half way sends it again, so a delta may
#   appear twice. Each delta carries the output position it reaches (completion_tokens); one
#   that does not move past what was delivered is a duplicate.
from __future__ import annotations

from dataclasses import dataclass, field

from service.events import FINAL_EVENTS, Event


@dataclass(slots=True)
class OutputFollower:
    owner: str | None = None  # the worker whose events count; None: whoever writes first
    num_tokens: int = 0  # output tokens delivered (the position reached)
    token_ids: list[int] = field(default_factory=list)  # those tokens, in order
    cached_tokens: int | None = None  # the first run's cached prompt tokens, once known
    # The first run's first-token and first-scheduled times (wall clock), once known: what a
    # worker resuming the request bills its latency from (the client saw that first token).
    first_token_time: float | None = None
    scheduled_time: float | None = None
    finished: bool = False

    def accept(self, event: Event) -> bool:
        """Whether to deliver `event`; updates the position. A reader delivers the accepted
        events in stream order and stops after a final one."""
        if self.finished:
            return False
        kind = event["type"]
        worker = event.get("worker")
        if kind == "resume":
            self.owner = worker
            return False
        if self.owner is None:
            self.owner = worker
        elif worker is not None and worker != self.owner:
            return False  # a worker that lost the request
        if kind == "delta":
            if event["completion_tokens"] <= self.num_tokens:
                return False  # a retried round trip's copy
            if self.cached_tokens is None and "cached_tokens" in event:
                self.cached_tokens = event["cached_tokens"]
                self.first_token_time = event.get("first_token_time")
                self.scheduled_time = event.get("scheduled_time")
            self.num_tokens = event["completion_tokens"]
            self.token_ids += event.get("token_ids", [])
        elif kind in FINAL_EVENTS:
            self.finished = True
        return True


def follow(events: list[Event]) -> tuple[OutputFollower, list[Event]]:
    """A whole stream read at once: the follower at its end and the events it delivers."""
    follower = OutputFollower()
    return follower, [e for e in events if follower.accept(e)]
