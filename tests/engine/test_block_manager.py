from engine.core.block_manager import BlockManager
from engine.core.request import Priority, Request
from engine.sampling_params import SamplingParams


def _req(rid: str, tokens: list[int], salt=None) -> Request:
    return Request(rid, tokens, SamplingParams(), Priority.INTERACTIVE, 16, cache_salt=salt)


def _compute(bm: BlockManager, req: Request, n: int) -> None:
    """What a step does: allocate, then mark the tokens computed and publish full blocks."""
    assert bm.allocate_slots(req, n)
    req.num_computed_tokens += n
    bm.cache_full_blocks(req)


def test_allocation_and_ref_counts():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = _req("a", list(range(10)))
    _compute(bm, a, 10)
    assert len(a.block_ids) == 3  # ceil(10 / 4)
    assert bm.num_free_blocks == 5
    assert all(bm.blocks[b].ref_count == 1 for b in a.block_ids)
    # Two full blocks are published, the partial third is not.
    assert len(bm.cached_blocks) == 2
    bm.free(a)
    assert bm.num_free_blocks == 8
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_shared_prefix_is_reused_and_ref_counted():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = _req("a", list(range(12)))
    _compute(bm, a, 12)
    b = _req("b", [*range(8), 99, 98, 97])
    hits = bm.find_cached_prefix(b)
    assert hits == a.block_ids[:2]
    assert bm.allocate_slots(b, 3, hits)
    assert b.block_ids[:2] == a.block_ids[:2]
    assert [bm.blocks[x].ref_count for x in a.block_ids] == [2, 2, 1]
    bm.free(a)
    assert [bm.blocks[x].ref_count for x in b.block_ids[:2]] == [1, 1]
    bm.free(b)
    assert bm.num_free_blocks == 8


def test_last_prompt_token_is_always_recomputed():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = _req("a", list(range(8)))
    _compute(bm, a, 8)
    first_block = a.block_ids[0]
    bm.free(a)
    assert len(bm.cached_blocks) == 2
    again = _req("again", list(range(8)))
    # Both blocks are cached, but only the first may be used: the last token must run.
    assert bm.find_cached_prefix(again) == [first_block]


def test_hash_chain_depends_on_parent_and_salt():
    bm = BlockManager(num_blocks=16, block_size=4)
    a = _req("a", [1, 2, 3, 4, 5, 6, 7, 8, 0])
    b = _req("b", [9, 9, 9, 9, 5, 6, 7, 8, 0])  # same second block, different parent
    c = _req("c", [1, 2, 3, 4, 5, 6, 7, 8, 0], salt="tenant-2")
    for r in (a, b, c):
        bm.update_block_hashes(r)
    assert a.block_hashes[1] != b.block_hashes[1]
    assert a.block_hashes[0] != c.block_hashes[0] and a.block_hashes[1] != c.block_hashes[1]
    _compute(bm, a, 9)
    assert bm.find_cached_prefix(_req("a2", [1, 2, 3, 4, 5, 6, 7, 8, 0])) == a.block_ids[:2]
    assert bm.find_cached_prefix(_req("c2", [1, 2, 3, 4, 5, 6, 7, 8, 0], salt="tenant-2")) == []


def test_hit_is_verified_against_stored_tokens():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = _req("a", [1, 2, 3, 4, 5])
    _compute(bm, a, 5)
    # Forge a collision: another request whose first block hash equals a's.
    b = _req("b", [7, 7, 7, 7, 5])
    bm.update_block_hashes(b)
    b.block_hashes[0] = a.block_hashes[0]
    assert bm.find_cached_prefix(b) == []


def test_freed_blocks_are_evicted_lazily_in_lru_order():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = _req("a", [1, 2, 3, 4, 5])  # blocks: [1,2] [3,4] [5]
    _compute(bm, a, 5)
    first, second, partial = a.block_ids
    bm.free(a)
    # Hashes survive the free.
    assert len(bm.cached_blocks) == 2
    # The unhashed partial block and the never-used block go first; then the request's tail
    # block, and its head block last.
    c = _req("c", [9, 9, 9, 9, 9, 9, 9])
    assert bm.allocate_slots(c, 6)
    assert first not in c.block_ids and second in c.block_ids and partial in c.block_ids
    assert len(bm.cached_blocks) == 1  # `second` lost its hash when reused
    assert bm.find_cached_prefix(_req("a2", [1, 2, 3, 4, 5])) == [first]


def test_allocation_fails_without_side_effects():
    bm = BlockManager(num_blocks=2, block_size=4)
    a = _req("a", list(range(12)))
    assert not bm.allocate_slots(a, 12)
    assert a.block_ids == [] and bm.num_free_blocks == 2


def test_cached_free_blocks_count_against_new_allocations():
    # A hit on a block in the free queue takes it out of the queue: the allocator must not
    # hand the same block out twice.
    bm = BlockManager(num_blocks=3, block_size=2)
    a = _req("a", [1, 2, 3, 4, 5])
    _compute(bm, a, 5)
    bm.free(a)
    b = _req("b", [1, 2, 3, 4, 6, 7, 8])
    hits = bm.find_cached_prefix(b)
    assert len(hits) == 2
    assert not bm.allocate_slots(b, 3, hits)  # needs 2 new blocks, only 1 left besides hits
    assert bm.allocate_slots(b, 1, hits)
    assert len(set(b.block_ids)) == len(b.block_ids) == 3
    bm.free(b)
    assert bm.num_free_blocks == 3


def test_reset_prefix_cache_drops_unheld_blocks_and_keeps_running_ones():
    bm = BlockManager(num_blocks=8, block_size=4)
    done = _req("done", list(range(12)))
    _compute(bm, done, 12)
    done_blocks = list(done.block_ids)
    bm.free(done)
    running = _req("running", [50 + t for t in range(8)])
    _compute(bm, running, 8)
    assert len(bm.cached_blocks) == 5

    assert bm.reset_prefix_cache() == 3  # the finished request's blocks
    assert set(bm.cached_blocks.values()) == set(running.block_ids)
    assert bm.find_cached_prefix(_req("again", list(range(12)))) == []
    # A block of the running request is still hit by a request sharing its prefix.
    assert bm.find_cached_prefix(_req("shared", [50 + t for t in range(6)])) == [
        running.block_ids[0]
    ]
    # Dropped blocks are unhashed, so they are handed out before any still-cached one.
    bm.free(running)
    assert set(list(bm.free_queue)[:3]) == set(done_blocks)
    assert bm.reset_prefix_cache() == 2
    assert bm.reset_prefix_cache() == 0
    assert bm.cached_blocks == {}
