# The prefix cache's block hashes, torch-free: the engine's block manager keys its cache with
# them, workers publish the ones they hold, and the API computes the same ones for a prompt to
# route it to the worker that holds its prefix (service/routing.py).
#
# Block i covers token ids [i * block_size, (i + 1) * block_size) and its hash chains its
# parent's (block i - 1); the first block's carries the cache salt (a tenant id) instead, so a
# salt isolates whole chains. blake2b, not Python's hash(): that one is salted per process
# (PYTHONHASHSEED) and the API and every worker must agree. 64 bits, as a cache hit is also
# checked against the stored token ids: a collision costs a miss, never a wrong answer.
from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from hashlib import blake2b

_ROOT, _CHILD = b"r", b"c"


def hash_block(parent: int | None, token_ids: Sequence[int], salt: object = None) -> int:
    h = blake2b(digest_size=8)
    if parent is None:
        h.update(_ROOT if salt is None else _ROOT + b"s" + str(salt).encode())
    else:
        h.update(_CHILD + parent.to_bytes(8, "little"))
    tokens = array("I", token_ids)  # token ids are below 2**32
    if sys.byteorder == "big":
        tokens.byteswap()
    h.update(tokens)
    return int.from_bytes(h.digest(), "little")


def extend_block_hashes(
    hashes: list[int],
    token_ids: Sequence[int],
    block_size: int,
    salt: object = None,
    max_blocks: int | None = None,
) -> list[int]:
    """Appends the hashes of the full blocks of `token_ids` past the `len(hashes)` already
    there (at most `max_blocks` in all); returns `hashes`."""
    num_full = len(token_ids) // block_size
    if max_blocks is not None:
        num_full = min(num_full, max_blocks)
    for i in range(len(hashes), num_full):
        parent = hashes[i - 1] if i else None
        block = token_ids[i * block_size : (i + 1) * block_size]
        hashes.append(hash_block(parent, block, salt if i == 0 else None))
    return hashes


def prefix_block_hashes(
    token_ids: Sequence[int], block_size: int, salt: object = None, max_blocks: int | None = None
) -> list[int]:
    """The hashes of a prompt's blocks that a prefix cache can serve: every full block but one
    holding the last token, which is always computed (engine/core/block_manager.py)."""
    limit = (len(token_ids) - 1) // block_size
    if max_blocks is not None:
        limit = min(limit, max_blocks)
    return extend_block_hashes([], token_ids, block_size, salt, max(limit, 0))


def hash_hex(block_hash: int) -> str:
    """How a hash is written in Redis (a worker's published blocks, the API's lookups)."""
    return f"{block_hash:016x}"
