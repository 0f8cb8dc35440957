# One step's Redis round trip of a GPU worker (workers/gpu/round_trip.py builds and sends it): the
# pipeline, what it carries out of the outbox, and at which index each of its reads replies.
from __future__ import annotations

from dataclasses import dataclass, field

import redis

from workers.gpu.outbox import Written
from workers.gpu.prefix_publisher import BlocksWritten


@dataclass(slots=True)
class Exchange:
    """One step's Redis round trip, and where its replies land in the results."""

    pipe: redis.client.Pipeline
    written: Written  # what it carries out of the outbox
    ids: list[str] = field(default_factory=list)  # inflight ids whose cancel keys were read
    leased: list[str] = field(default_factory=list)  # ... and whose leases were read
    streams: list[str] = field(default_factory=list)  # queues XAUTOCLAIMed, in order
    blocks: BlocksWritten | None = None  # prefix blocks published
    at_cancels: int = -1
    at_leases: int = -1
    at_reclaim: int = -1
    at_routes: int = -1  # the routed workers (SMEMBERS), read with the XAUTOCLAIMs
    at_take: int = -1  # the take script's reply (workers/gpu/work_intake.py)
    at_read: int = -1  # an idle worker's blocking XREADGROUP reply
    idle: bool = False  # nothing to step: the read may block
    build_s: float = 0.0
    io_s: float = 0.0
    read_streams: list[str] = field(default_factory=list)  # the queues work may be read from
    room: int = 0  # how many new requests the engine may take this turn

    def num_read(self, results: list) -> int:
        """New entries the round trip took (the take script, or the blocking read)."""
        if self.at_take >= 0:
            return len(results[self.at_take] or [])
        if self.at_read >= 0:
            return sum(len(entries) for _, entries in results[self.at_read] or [])
        return 0


def checked(exchange: Exchange, results: list) -> list:
    """Raises the first error of the round trip's replies, but for the XAUTOCLAIMs': a queue
    scanned may have been removed meanwhile (workers/gpu/work_intake.py's FORGET_SCRIPT)."""
    claims = range(exchange.at_reclaim, exchange.at_reclaim + len(exchange.streams))
    for i, reply in enumerate(results):
        if isinstance(reply, Exception) and i not in claims:
            raise reply
    return results
