# What a worker tells the router about its prefix cache: the hashes of the blocks it holds
# (fleetlm:worker:{id}:blocks, engine/block_hash.py's hashes of the first routing_max_blocks
# blocks of each cached prefix, at most routing_max_published_blocks of them). The engine reports
# what it cached and evicted since the last call; each round trip carries the difference (SADD,
# SREM), refreshes the set's TTL (the heartbeat's: a dead worker's set goes with it) and reads
# its size back. A size that disagrees with what the worker believes it published (the set
# expired during an outage, Redis lost it) makes the next round trip write the whole set again.
from __future__ import annotations

from dataclasses import dataclass, field

import redis

from engine.block_hash import hash_hex
from service import streams as p


@dataclass(slots=True)
class BlocksWritten:
    added: set[int] = field(default_factory=set)
    removed: set[int] = field(default_factory=set)
    whole: set[int] | None = None  # the whole set written anew
    at_size: int = -1  # the SCARD's reply in the round trip's results


class PrefixPublisher:
    def __init__(self, block_manager, worker_id: str, settings, ttl_ms: int) -> None:
        self.enabled = settings.routing and settings.enable_prefix_caching
        self.block_manager = block_manager
        self.key = p.blocks_key(worker_id)
        self.ttl_ms = ttl_ms
        self.cap = settings.routing_max_published_blocks
        self.published: set[int] = set()  # what Redis holds, as far as this worker knows
        self.adding: set[int] = set()
        self.removing: set[int] = set()
        self.rewrite = True  # the first round trip writes the whole set
        if self.enabled:
            block_manager.track_cache_events(settings.routing_max_blocks)

    def write(self, pipe: redis.client.Pipeline) -> BlocksWritten | None:
        if not self.enabled:
            return None
        for block_hash, cached in self.block_manager.take_cache_events().items():
            if cached:
                self.removing.discard(block_hash)
                if block_hash not in self.published:
                    self.adding.add(block_hash)
            else:
                self.adding.discard(block_hash)
                if block_hash in self.published:
                    self.removing.add(block_hash)
        room = self.cap - len(self.published) + len(self.removing)
        while len(self.adding) > max(room, 0):  # over the cap: left out, never published
            self.adding.pop()
        out = BlocksWritten(added=set(self.adding), removed=set(self.removing))
        if self.rewrite:
            out.whole = (self.published - self.removing) | self.adding
            pipe.delete(self.key)
            if out.whole:
                pipe.sadd(self.key, *map(hash_hex, out.whole))
        else:
            if out.added:
                pipe.sadd(self.key, *map(hash_hex, out.added))
            if out.removed:
                pipe.srem(self.key, *map(hash_hex, out.removed))
        pipe.pexpire(self.key, self.ttl_ms)
        out.at_size = len(pipe)
        pipe.scard(self.key)
        return out

    def confirm(self, out: BlocksWritten | None, results: list) -> None:
        """Redis took the round trip that carried `out`."""
        if out is None:
            return
        if out.whole is not None:
            self.published = out.whole
        else:
            self.published = (self.published - out.removed) | out.added
        self.adding -= out.added
        self.removing -= out.removed
        self.rewrite = results[out.at_size] != len(self.published)

    @property
    def num_published(self) -> int:
        return len(self.published)
