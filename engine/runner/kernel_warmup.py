# Start-up compilation of the kernel variants a mixed step (decodes + prompt chunks) can reach,
# so that none compiles while serving. CUDA graphs compile what they capture (pure decode steps,
# the pieces' non-attention work at every bucket), but attention in a mixed step launches
# eagerly and its launchers pick constexpr variants per step:
#   * prefill attention: the tile height from the longest chunk (rows = query tokens x query
#     heads per KV head, tiles of 16, 32, 64 or 128 rows), the warp-specialized kernel from
#     1,024 query tokens, with or without a cached prefix;
#   * decode attention beside them: the reduce kernel's width from the step's split count
#     (balanced_num_splits: 1, 2, 4 ... 64);
#   * both with q/k/v as the graph pieces hand them (their own buffers) and as the eager forward
#     does (views of one fused qkv tensor), which differ in strides;
#   * with shared-prefix decode on, decodes in one group beside a chunk at every suffix and
#     prefix split count (the split kernel's suffix variant, the prefix kernel, and the reduce
#     over both, whose width is the sum);
#   * with the prefill key splits on (EngineConfig.prefill_split_keys), the split variant of the
#     paged prefill kernel at every tile height, and its partials' reduce at every split count;
#   * with a draft model (speculative_method "draft"), the same steps through the draft too: it
#     follows every prompt chunk eagerly and catches up in eager prefill passes, at its own head
#     counts and widths, so its variants differ from the target's.
# On the H200 one such variant first met mid-serving stopped a 166-token step for 1.9 s
# (docs/benchmarks-log.md#the-per-step-token-budget-h200). The steps below are synthetic: padding
# slots (-1) so nothing is written to the KV pool, block tables over its first blocks (read
# only, before any request owns them), the same packing as real steps (BatchBuilder.to_device).
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from engine.runner.batch_builder import PackedBatch

# Chunk lengths that reach every tile height of the prefill launchers for 1, 2, 4 or 8 query
# heads per KV head, and the warp-specialized kernel (kernels/dense_prefill_attention.py,
# kernels/paged_prefill_attention.py).
CHUNK_LENS = (1, 2, 3, 5, 9, 17, 33, 300, 1024)
DECODE_SPLITS = (1, 2, 4, 8, 16, 32, 64)  # kernels/paged_decode_attention.py: MAX_SPLITS = 64
CACHED_PREFIX = 64  # tokens before a chunk that has a cached prefix
DECODE_CONTEXT = 512


@dataclass(frozen=True, slots=True)
class WarmupStep:
    num_decodes: int
    decode_splits: int | None  # None: no decodes
    chunks: tuple[tuple[int, int], ...]  # (query tokens, cached tokens before them) per prompt
    prefix_splits: int = 0  # > 0: the decodes form one shared-prefix group (split this often)
    prefill_splits: int = 1  # key ranges of the chunks' attention (> 1: the split kernel)

    @property
    def num_tokens(self) -> int:
        return self.num_decodes + sum(q for q, _ in self.chunks)


def warmup_steps(
    max_tokens: int, max_model_len: int, shared_prefix: bool = False, prefill_split: bool = False
) -> list[WarmupStep]:
    """The synthetic steps: every chunk length with and without a cached prefix beside a few
    decodes, then every decode split count beside a short chunk (and with shared_prefix, beside
    a shared-prefix group split as often; with prefill_split, every chunk length and split count
    through the split prefill kernel). Steps longer than max_tokens or max_model_len are left
    out (they cannot happen)."""
    steps = [WarmupStep(3, 1, ((q, prefix),)) for q in CHUNK_LENS for prefix in (0, CACHED_PREFIX)]
    steps += [WarmupStep(3, s, ((17, CACHED_PREFIX),)) for s in DECODE_SPLITS]
    if shared_prefix:
        steps += [WarmupStep(3, s, ((17, CACHED_PREFIX),), s) for s in DECODE_SPLITS]
    if prefill_split:
        steps += [WarmupStep(3, 1, ((q, CACHED_PREFIX),), prefill_splits=2) for q in CHUNK_LENS]
        splits = DECODE_SPLITS[2:]  # 1 and 2 are above
        steps += [WarmupStep(3, 1, ((17, CACHED_PREFIX),), prefill_splits=s) for s in splits]
    steps += [WarmupStep(0, None, ((q, 0),)) for q in (CHUNK_LENS[0], CHUNK_LENS[-1])]
    return [
        s for s in steps
        if s.num_tokens <= max_tokens and all(q + p <= max_model_len for q, p in s.chunks)
    ]  # fmt: skip


def pack(
    step: WarmupStep,
    block_size: int,
    num_blocks: int,
    max_model_len: int,
    max_rows: int = 16,
    decode_context: int = DECODE_CONTEXT,
    distinct_tables: bool = False,
) -> PackedBatch:
    """The step as BatchBuilder.pack would lay it out: decodes first (decode_context keys, at
    most max_model_len), token 0 everywhere, slots -1 (nothing stored), block tables 0, 1, 2 ...
    (clamped to the pool); with prefix_splits the decodes (same tables) are one group of a
    max_rows bucket sharing their whole blocks before the last key. distinct_tables: each row
    reads blocks of its own, wrapping around the pool (a timed step: rows sharing blocks read
    them from L2, and the calibration priced a key at half its served cost on an H100)."""
    context = min(decode_context, max_model_len)
    lens = [(1, context - 1)] * step.num_decodes + list(step.chunks)
    positions, seq_lens, starts = [], [], [0]
    for q, before in lens:
        positions.extend(range(before, before + q))
        seq_lens.append(before + q)
        starts.append(starts[-1] + q)
    t, s, nd = starts[-1], len(lens), step.num_decodes
    max_blocks = -(-max(seq_lens) // block_size)
    if distinct_tables:
        tables = np.arange(s * max_blocks, dtype=np.int64).reshape(s, max_blocks) % num_blocks
        tables = tables.astype(np.int32)
    else:
        tables = np.minimum(np.arange(max_blocks, dtype=np.int32), num_blocks - 1)
        tables = np.broadcast_to(tables, (s, max_blocks))
    logits_indices = [end - 1 for end in starts[1:]]
    prefill_qsl = [q - starts[nd] for q in starts[nd:]]
    i64 = np.array([0] * t + positions + [-1] * t + logits_indices, dtype=np.int64)
    header = np.array(seq_lens + starts + prefill_qsl, dtype=np.int32)
    decode_order = np.arange(nd, dtype=np.int32)  # equal contexts: any order is longest-first
    parts = [header, tables.ravel(), decode_order]
    groups = None
    prefix = (context - 1) // block_size * block_size
    if step.prefix_splits and 2 <= nd <= max_rows and prefix:
        rows = np.full((1, max_rows), -1, dtype=np.int32)
        rows[0, :nd] = np.arange(nd)
        parts += [rows.ravel(), np.array([prefix], dtype=np.int32), np.full(nd, prefix, np.int32)]
        groups = (1, max_rows)
    return PackedBatch(
        i64=i64, i32=np.concatenate(parts), num_tokens=t,
        num_seqs=s, max_blocks=max_blocks, num_decodes=nd, max_query_len=max(q for q, _ in lens),
        has_drafts=False, decode_num_splits=step.decode_splits, prefix_groups=groups,
        decode_prefix_splits=max(1, step.prefix_splits), prefill_num_splits=step.prefill_splits,
    )  # fmt: skip


@torch.inference_mode()
def warm_up_mixed_steps(runner) -> dict:
    """Run every warm-up step through the eager forward and, when the runner has them, the graph
    pieces; the device is synchronised at the end. Returns what it ran and how long it took."""
    from kernels import compile_counter

    compile_counter.install()
    before = compile_counter.snapshot()
    t0 = time.perf_counter()
    max_tokens = runner.config.max_num_batched_tokens
    limits = runner.batch_builder.prefix_groups
    split = runner.batch_builder.prefill_split is not None
    steps = warmup_steps(
        max_tokens, runner.max_model_len, shared_prefix=limits is not None, prefill_split=split
    )
    max_rows = limits.max_rows if limits is not None else 16
    pieces = runner.piecewise
    for step in steps:
        packed = pack(step, runner.block_size, runner.num_blocks, runner.max_model_len, max_rows)
        batch = runner.batch_builder.to_device(packed)
        hidden = runner._forward(batch.input_ids, batch.positions, batch.meta)  # eager
        logits = runner.model.compute_logits(hidden[batch.logits_indices])
        if runner.draft is not None:  # slots -1: nothing lands in the draft's cache either
            runner.draft.forward(batch.input_ids, batch.positions, batch.meta)
        if pieces is not None and pieces.can_run(step.num_tokens):
            pieces.run(batch)
    if runner.device.type == "cuda":
        if steps:
            warm_up_token_bitmask(logits, runner.dtype)
        torch.cuda.synchronize(runner.device)
    after = compile_counter.snapshot()
    return {
        "steps": len(steps),
        "seconds": time.perf_counter() - t0,
        "compiles": after.count - before.count,
        "compile_seconds": after.seconds - before.seconds,
    }


def warm_up_token_bitmask(logits: torch.Tensor, model_dtype: torch.dtype) -> None:
    """Compile the grammar-mask kernel's variants (with and without row ids) for both logits
    dtypes a step produces: float32 from an eager forward, the model's dtype from a decode
    graph. Without the second, the first step that mixed constrained and plain rows in a
    graph-replayed decode compiled one in the step (144 ms against 6 on the H200's 8B). Every
    bit set: the logits are left as they are."""
    from kernels.token_bitmask import apply_token_bitmask

    n = min(logits.shape[0], 2)
    allowed = torch.full((n, (logits.shape[1] + 31) // 32), -1, dtype=torch.int32,
                         device=logits.device)  # fmt: skip
    for dtype in dict.fromkeys((logits.dtype, model_dtype)):
        rows = logits[:n].to(dtype)
        apply_token_bitmask(rows, allowed)
        apply_token_bitmask(rows, allowed, torch.arange(n, device=logits.device))
