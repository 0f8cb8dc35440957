# Finds the decode rows that share their leading KV-cache blocks (the prefix cache hands
# requests with the same prompt prefix the same physical block ids: engine/core/block_manager.py),
# for kernels/shared_prefix_decode.py. Host-side numpy, vectorised, no Python loop over rows.
#
# A prefix-cache block's hash chains its parent's, so two rows holding the same block id in
# column j hold the same blocks in columns < j too. So: rows keyed by their block in column
# min_blocks - 1 -> each row's common leading blocks with its key's first row (compared, not
# assumed) -> chunks of <= max_rows rows, prefix = the chunk's smallest common length.
#
# Only whole blocks before a row's last key count (a decode row's last block is its own, being
# written), and at most max_blocks of them: a longer shared prefix is capped, the rest is read
# by the suffix pass (correct either way: key_start only moves keys between the two passes).
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from engine.config import EngineConfig

# The engine's bounds: 16 rows per group (the 70B's group of 8 query heads: a 128-row dot),
# up to 32 groups a step, shared prefixes counted up to 8,192 keys.
MAX_ROWS = 16
MAX_GROUPS = 32
MAX_PREFIX_TOKENS = 8192


@dataclass(slots=True)
class PrefixGroupLimits:
    """find_prefix_groups' bounds, in blocks and rows (runner/batch_builder.py passes them)."""

    min_blocks: int  # shortest shared prefix worth a group
    max_blocks: int  # a longer shared prefix is capped (the rest goes to the suffix pass)
    max_groups: int
    max_rows: int  # rows per group: the prefix kernel's M side is max_rows x the GQA group

    def __post_init__(self) -> None:
        if not 1 <= self.min_blocks <= self.max_blocks or self.max_groups < 0:
            raise ValueError("need 1 <= min_blocks <= max_blocks and max_groups >= 0")
        if self.max_rows < 2:
            raise ValueError("max_rows must be >= 2")


def shared_prefix_limits(config: EngineConfig) -> PrefixGroupLimits | None:
    """The batch builder's bounds for this engine, None when shared-prefix decode is off."""
    if not config.shared_prefix_decode:
        return None
    bs = config.block_size
    min_blocks = -(-config.shared_prefix_min_tokens // bs)
    max_blocks = max(min_blocks, MAX_PREFIX_TOKENS // bs)
    return PrefixGroupLimits(min_blocks, max_blocks, MAX_GROUPS, MAX_ROWS)


@dataclass(slots=True)
class PrefixGrouping:
    """Fixed-shape host arrays (a CUDA graph's bucket): rows [max_groups, max_rows] int32 with
    -1 for empty slots, prefix_lens [max_groups] int32 (0 in unused groups), key_start
    [num_rows] int32 (the row's prefix length, 0 in no group)."""

    rows: np.ndarray
    prefix_lens: np.ndarray
    key_start: np.ndarray

    @property
    def num_groups(self) -> int:
        return int((self.prefix_lens > 0).sum())  # the used groups come first

    def trimmed(self) -> PrefixGrouping:
        """Only the used groups (an eager launch's grid need not cover the empty ones)."""
        n = self.num_groups
        return PrefixGrouping(self.rows[:n], self.prefix_lens[:n], self.key_start)

    @property
    def num_grouped_rows(self) -> int:
        return int((self.rows >= 0).sum())

    @property
    def shared_keys_saved(self) -> int:
        """Prefix keys not read again: (rows - 1) x prefix length, summed over the groups."""
        members = (self.rows >= 0).sum(axis=1)
        return int((np.maximum(members - 1, 0) * self.prefix_lens).sum())


def find_prefix_groups(
    block_tables: np.ndarray,
    seq_lens: np.ndarray,
    block_size: int,
    *,
    min_blocks: int,
    max_blocks: int,
    max_groups: int,
    max_rows: int,
) -> PrefixGrouping:
    """Groups of >= 2 rows sharing >= min_blocks leading blocks. block_tables [num_rows, width]
    int32 (entries past a row's blocks may hold anything), seq_lens [num_rows]. The largest
    savings are kept when there are more than max_groups groups."""
    if min_blocks < 1 or max_blocks < min_blocks or max_groups < 0 or max_rows < 2:
        raise ValueError("need 1 <= min_blocks <= max_blocks, max_groups >= 0, max_rows >= 2")
    num_rows = len(seq_lens)
    rows = np.full((max_groups, max_rows), -1, dtype=np.int32)
    prefix_lens = np.zeros(max_groups, dtype=np.int32)
    key_start = np.zeros(num_rows, dtype=np.int32)
    seq_lens = np.asarray(seq_lens, dtype=np.int64)
    # whole blocks before each row's last key, capped
    full = np.minimum((seq_lens - 1).clip(min=0) // block_size, max_blocks)
    cand = np.flatnonzero(full >= min_blocks)
    if len(cand) < 2 or max_groups == 0:
        return PrefixGrouping(rows, prefix_lens, key_start)

    key = block_tables[cand, min_blocks - 1]
    order = np.argsort(key, kind="stable")
    cand, key = cand[order], key[order]
    run = np.cumsum(np.concatenate(([True], key[1:] != key[:-1]))) - 1  # [n] key's run id
    run_start = np.flatnonzero(np.diff(run, prepend=-1))
    leader = cand[run_start][run]  # [n] the first row of each row's key
    # lcp[i]: leading blocks row cand[i] has in common with its leader, compared block by block
    width = int(full[cand].max())
    same = np.zeros((len(cand), width + 1), dtype=bool)  # a last False column: lcp <= width
    np.equal(block_tables[cand, :width], block_tables[leader, :width], out=same[:, :width])
    lcp = same.argmin(axis=1)  # the first block that differs (argmin of bools: first False)
    lcp = np.minimum(lcp, np.minimum(full[cand], full[leader]))  # only blocks both rows fill

    # within a run deepest sharers first; rows sharing < min_blocks with their leader drop out
    order = np.lexsort((-lcp, run))
    keep = order[lcp[order] >= min_blocks]
    cand, run, lcp = cand[keep], run[keep], lcp[keep]
    n = len(cand)
    run_start = np.flatnonzero(np.diff(run, prepend=-1))
    rank = np.arange(n) - np.repeat(run_start, np.diff(np.append(run_start, n)))
    chunk = rank // max_rows  # chunks of <= max_rows rows of one run
    new_group = np.diff(run, prepend=-1) != 0
    new_group |= np.diff(chunk, prepend=-1) != 0
    g_start = np.flatnonzero(new_group)
    g_size = np.diff(np.append(g_start, n))
    g_blocks = np.minimum.reduceat(lcp, g_start)  # a chunk shares its smallest lcp
    saved = np.where(g_size >= 2, (g_size - 1) * g_blocks, -1)
    chosen = np.argsort(-saved, kind="stable")[:max_groups]
    chosen = chosen[saved[chosen] > 0]  # the largest savings, groups of >= 2 rows only
    slot_of = np.full(len(g_start), -1)
    slot_of[chosen] = np.arange(len(chosen))
    gid = np.cumsum(new_group) - 1  # [n] group of each row
    slot = slot_of[gid]
    m = slot >= 0
    rows[slot[m], (np.arange(n) - g_start[gid])[m]] = cand[m]
    prefix_lens[: len(chosen)] = g_blocks[chosen] * block_size
    key_start[cand[m]] = g_blocks[gid[m]] * block_size
    return PrefixGrouping(rows, prefix_lens, key_start)
