# The torch-free block hashes (engine/block_hash.py) are the engine's own: the API routes on them
# and workers publish them, so they must agree with the block manager's, across processes too
# (Python's hash() is salted per process), and the cache events must track what is cached.
from __future__ import annotations

import os
import subprocess
import sys

from engine.block_hash import extend_block_hashes, hash_block, prefix_block_hashes
from engine.core.block_manager import BlockManager
from engine.core.request import Priority, Request
from engine.sampling_params import SamplingParams
from tests.e2e.conftest import ROOT


def _req(rid: str, tokens: list[int], salt=None) -> Request:
    return Request(rid, tokens, SamplingParams(), Priority.INTERACTIVE, 16, cache_salt=salt)


def _compute(bm: BlockManager, req: Request, n: int) -> None:
    assert bm.allocate_slots(req, n)
    req.num_computed_tokens += n
    bm.cache_full_blocks(req)


def test_the_block_manager_hashes_what_the_torch_free_function_hashes():
    tokens = [(7 * i) % 500 for i in range(70)]
    for salt in (None, "tenant-a", "tenant-b"):
        bm = BlockManager(num_blocks=16, block_size=16)
        req = _req("a", tokens, salt)
        bm.update_block_hashes(req)
        assert req.block_hashes == extend_block_hashes([], tokens, 16, salt)
        assert len(req.block_hashes) == 4
        # What the API looks up: every full block but one holding the last token.
        assert prefix_block_hashes(tokens, 16, salt) == req.block_hashes
        assert prefix_block_hashes(tokens[:64], 16, salt) == req.block_hashes[:3]
        assert prefix_block_hashes(tokens, 16, salt, max_blocks=2) == req.block_hashes[:2]


def test_the_hash_chains_the_parent_and_salts_only_through_the_first_block():
    a = extend_block_hashes([], list(range(8)), 4, "t1")
    b = extend_block_hashes([], list(range(8)), 4, "t2")
    assert a[0] != b[0] and a[1] != b[1]
    assert a[1] == hash_block(a[0], [4, 5, 6, 7])
    assert hash_block(None, [1, 2]) != hash_block(None, [1, 2], "t1")


def test_hashes_are_the_same_in_another_process():
    code = (
        "from engine.block_hash import extend_block_hashes;"
        "print(extend_block_hashes([], list(range(40)), 16, 'tenant-x'))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == str(extend_block_hashes([], list(range(40)), 16, "tenant-x"))


def test_cache_events_report_published_and_evicted_blocks_up_to_the_depth():
    bm = BlockManager(num_blocks=4, block_size=2)
    bm.track_cache_events(max_depth=1)
    a = _req("a", [1, 2, 3, 4, 5])
    _compute(bm, a, 5)
    bm.update_block_hashes(a)
    # Only the first block is shallow enough to be reported.
    assert bm.take_cache_events() == {a.block_hashes[0]: True}
    assert bm.take_cache_events() == {}
    bm.free(a)
    c = _req("c", [9, 9, 9, 9, 9, 9, 9])
    assert bm.allocate_slots(c, 7)  # takes every block: both hashes are evicted
    assert bm.take_cache_events() == {h: False for h in a.block_hashes}
    bm.free(c)
    again = _req("a2", [1, 2, 3])
    _compute(bm, again, 3)
    assert bm.take_cache_events() == {a.block_hashes[0]: True}
    bm.free(again)
    assert bm.reset_prefix_cache() == 1
    assert bm.take_cache_events() == {a.block_hashes[0]: False}


def test_no_cache_events_unless_asked():
    bm = BlockManager(num_blocks=4, block_size=2)
    _compute(bm, _req("a", [1, 2, 3, 4, 5]), 5)
    assert bm.cache_events is None and bm.take_cache_events() == {}
