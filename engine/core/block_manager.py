# Paged KV block manager with prefix caching.
#
# Every full block of a request's tokens has a chained hash (engine/block_hash.py: parent hash,
# the block's token ids, and for the first block the request's cache salt, a tenant id say), so a
# salt isolates whole chains. Blocks whose K/V are computed are published under
# their hash; a later request walks its own chain and reuses the matching prefix. A hit is
# verified against the stored token ids and parent hash, so a hash collision costs a miss,
# never a wrong answer.
#
# Freed blocks keep their hash and sit in an LRU free queue; they are evicted (hash dropped)
# only when the allocator needs them. Invariant: a block is in `free_queue` iff ref_count == 0.
#
# Cache events (off unless a caller asks, as a GPU worker does to publish what it holds for
# routing): hash → True when a block of depth < the asked depth is published, False when a hash
# leaves the cache; `take_cache_events` hands over each hash's latest state since the last call.
from __future__ import annotations

from collections import OrderedDict

from engine.block_hash import extend_block_hashes
from engine.core.request import Request


class KVBlock:
    __slots__ = ("block_hash", "block_id", "parent_hash", "ref_count", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: int | None = None
        self.parent_hash: int | None = None
        self.token_ids: tuple[int, ...] | None = None

    def reset(self) -> None:
        self.block_hash = None
        self.parent_hash = None
        self.token_ids = None


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1:
            raise ValueError("the KV pool needs at least one block")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # Front = evicted first. Unhashed blocks go to the front, hashed ones to the back.
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached_blocks: dict[int, int] = {}  # block hash → block id
        self.prefix_cache_queries = 0  # prompt tokens looked up
        self.prefix_cache_hits = 0  # of those, tokens found
        self.cache_events: dict[int, bool] | None = None
        self.cache_event_depth = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- hashing -------------------------------------------------------------------------

    def update_block_hashes(self, request: Request) -> None:
        extend_block_hashes(
            request.block_hashes, request.token_ids, self.block_size, request.cache_salt
        )

    # -- cache events --------------------------------------------------------------------

    def track_cache_events(self, max_depth: int) -> None:
        """Record blocks published at depth < max_depth (the first block is depth 0) and every
        hash that leaves the cache, from now on."""
        self.cache_events = {}
        self.cache_event_depth = max_depth

    def take_cache_events(self) -> dict[int, bool]:
        """Each hash whose state changed since the last call → whether it is cached now."""
        events = self.cache_events or {}
        if self.cache_events is not None:
            self.cache_events = {}
        return events

    def _uncache(self, block_hash: int) -> None:
        del self.cached_blocks[block_hash]
        if self.cache_events is not None:
            self.cache_events[block_hash] = False

    # -- prefix lookup -------------------------------------------------------------------

    def find_cached_prefix(self, request: Request) -> list[int]:
        """Block ids of the longest cached prefix. The last prompt token is never served from
        the cache, so the forward pass always has at least one position to sample from."""
        if not self.enable_prefix_caching:
            return []
        self.update_block_hashes(request)
        bs = self.block_size
        max_blocks = (request.num_tokens - 1) // bs
        hits: list[int] = []
        parent = None
        for i in range(max_blocks):
            block_id = self.cached_blocks.get(request.block_hashes[i])
            if block_id is None:
                break
            block = self.blocks[block_id]
            if block.parent_hash != parent or block.token_ids != tuple(
                request.token_ids[i * bs : (i + 1) * bs]
            ):
                break
            hits.append(block_id)
            parent = request.block_hashes[i]
        # The hit counters are the scheduler's to move, once per admission: a request whose
        # admission waits for memory looks its prefix up again every step.
        return hits

    # -- allocation ----------------------------------------------------------------------

    def allocate_slots(
        self, request: Request, num_new_tokens: int, cached_block_ids: list[int] = ()
    ) -> bool:
        """Make room for `num_new_tokens` beyond the request's computed (or cached) tokens.
        Returns False, changing nothing, when the pool cannot supply the blocks."""
        held = len(request.block_ids) + len(cached_block_ids)
        num_computed = request.num_computed_tokens + len(cached_block_ids) * self.block_size
        num_needed = self.num_blocks_for(num_computed + num_new_tokens) - held
        # Cached hits with no other owner sit in the free queue; taking them shrinks it.
        num_revived = sum(1 for b in cached_block_ids if self.blocks[b].ref_count == 0)
        if num_needed > self.num_free_blocks - num_revived:
            return False
        for block_id in cached_block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_queue[block_id]
            block.ref_count += 1
            request.block_ids.append(block_id)
        if cached_block_ids:  # hits are published blocks already
            request.num_registered_blocks = len(request.block_ids)
        for _ in range(max(num_needed, 0)):
            request.block_ids.append(self._pop_free_block())
        return True

    def _pop_free_block(self) -> int:
        block_id, _ = self.free_queue.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:
            # Lazy eviction: the hash leaves the cache only now that the block is reused.
            if self.cached_blocks.get(block.block_hash) == block_id:
                self._uncache(block.block_hash)
            block.reset()
        block.ref_count = 1
        return block_id

    def cache_full_blocks(self, request: Request) -> None:
        """Publish the request's blocks whose every token now has computed K/V."""
        if not self.enable_prefix_caching:
            return
        num_full = min(request.num_computed_tokens // self.block_size, len(request.block_ids))
        if num_full <= request.num_registered_blocks:
            return
        self.update_block_hashes(request)
        bs = self.block_size
        for i in range(request.num_registered_blocks, num_full):
            block = self.blocks[request.block_ids[i]]
            block_hash = request.block_hashes[i]
            if block.block_hash is None and block_hash not in self.cached_blocks:
                block.block_hash = block_hash
                block.parent_hash = request.block_hashes[i - 1] if i else None
                block.token_ids = tuple(request.token_ids[i * bs : (i + 1) * bs])
                self.cached_blocks[block_hash] = block.block_id
                if self.cache_events is not None and i < self.cache_event_depth:
                    self.cache_events[block_hash] = True
        request.num_registered_blocks = num_full

    def trim(self, request: Request, num_tokens: int) -> None:
        """Return the trailing blocks beyond what `num_tokens` need (speculative decoding
        reserved them for drafts that were rejected). They were fresh allocations past every
        full, published block, so they hold no hash and go to the front of the free queue."""
        keep = self.num_blocks_for(num_tokens)
        if len(request.block_ids) <= keep:
            return
        while len(request.block_ids) > keep:
            block = self.blocks[request.block_ids.pop()]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_queue[block.block_id] = None
                if block.block_hash is None:
                    self.free_queue.move_to_end(block.block_id, last=False)
        # The cached row is keyed by list identity and length; a later re-grow to the same
        # length with other block ids would otherwise reuse a stale row.
        request.block_table_cache = None

    def free(self, request: Request) -> None:
        # Reverse order: a request's tail blocks are evicted before its (more shareable) head.
        for block_id in reversed(request.block_ids):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_queue[block_id] = None
                if block.block_hash is None:
                    self.free_queue.move_to_end(block_id, last=False)
        request.block_ids = []
        request.num_registered_blocks = 0

    def reset_prefix_cache(self) -> int:
        """Drops every cached block no request holds; returns how many. Blocks of running
        requests keep their hashes (their K/V is live), so they stay cached and can still be
        hit once those requests finish."""
        num_freed = 0
        for block in self.blocks:
            if block.ref_count == 0 and block.block_hash is not None:
                if self.cached_blocks.get(block.block_hash) == block.block_id:
                    self._uncache(block.block_hash)
                block.reset()
                self.free_queue.move_to_end(block.block_id, last=False)  # unhashed: front
                num_freed += 1
        return num_freed
