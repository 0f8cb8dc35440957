# Causal prefill attention that reads each chunk's own keys from this step's new K/V tensors
# ("dense") instead of gathering them back out of the paged cache. The fast path for sm_90.
#   q:               [num_tokens, num_heads, head_dim], sequences packed back to back
#   k, v:            [num_tokens, num_kv_heads, head_dim], this step's new keys/values, packed
#                    like q (views of the fused qkv projection are fine)
#   k_cache/v_cache: [num_blocks, block_size, num_kv_heads, head_dim] in q's dtype; read only for
#                    a cached prefix (seq_len > q_len: prefix-cache hits, later prefill chunks)
#   block_tables, seq_lens, query_start_loc: as in paged_prefill_attention
# Same result as paged_prefill_attention once store_kv has copied k/v into the cache (a bf16
# cache holds k/v bit for bit); an FP8 cache holds rounded values, so it keeps the paged path.
#
# Design (Triton 3.6, Hopper). Per program: one (BLOCK_M-row tile, sequence, KV head).
# * GQA packing: rows are (query, group head) pairs, row = q_idx * GROUP + g, so one K/V tile
#   feeds the whole head group (with GROUP 4 a 128-row tile is 32 queries x 4 heads) and the
#   causal diagonal cuts through few rows: with 32 queries per tile a BLOCK_N >= 32 key walk
#   crosses the diagonal in one tile.
# * Key walk in three loops whose masks are compile-time: the cached prefix through the block
#   table (every key visible; only its partial last tile masks the bound), the chunk's keys that
#   every row of the tile sees (no masks at all: plain wgmma + exp2), then the tiles crossing
#   the diagonal (causal mask). A prefix-free row (a whole new prompt) never reads the cache.
# * K/V of the unmasked chunk tiles through the copy engine (host TensorDescriptors over k/v
#   seen as [num_tokens, num_kv_heads * head_dim]; in the sweep, not the default); the diagonal and
#   prefix tiles, and k/v the descriptors cannot take, use pointer loads (cp.async pipelined).
# * Online softmax in the log2 domain: qk_scale = softmax scale * log2(e) is applied with one
#   FMA (s * qk_scale - m) before exp2; P @ V accumulates into acc in place (tl.dot's acc).
# * Longest tiles first: grid (num_kv_heads, num_seqs, num_tiles) with the tile index reversed,
#   so the blocks the GPU dispatches first are the last query rows (most keys) of every head
#   and sequence, and the cheap first tiles fill the tail of the last wave.
# * Fixed launch configuration (no autotuning): deterministic, and safe to capture in a CUDA
#   graph; the grid depends only on host ints. kernel_bench/prefill.py times the alternatives.
# * Variants by PrefillConfig: tma (above), maxnreg (a register cap: 128 fits two 8-warp programs
#   per SM), warp_spec (kernels/dense_prefill_ws.py: producer/consumer warpgroups, the cached
#   prefix merged by a second kernel), lazy (the chunk tiles rescale acc / l only when a row's
#   max grows past LAZY_THRESHOLD).
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels._launch import (
    INDEX_DTYPES,
    check_contiguous,
    check_last_dim_contiguous,
    check_launchable,
    check_paged_attention,
    check_shape,
    check_tensor,
    dot_config,
    host_int,
    interpreting,
    output_buffer,
)
from kernels.dense_prefill_ws import descriptor_2d, launch_ws, ws_ready, ws_supported
from kernels.paged_prefill_attention import LOG2E, _attend_paged_keys

# PrefillConfig.lazy: the running max a tile's scores are taken against moves (and acc, l with
# it) only when some row's max grows by more than this, in log2 units; otherwise p = exp2(s -
# m) <= 2^8, well inside fp32 and bf16/fp16 range (fp16: 65504). Exact: acc and l always hold
# sums against the same m, so acc / l is the softmax whatever m is.
LAZY_THRESHOLD = tl.constexpr(8.0)


def dense_prefill_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Keys of sequence i: its ctx = seq_len - q_len cached ones (paged cache), then its q_len
    new ones (k/v rows of its chunk). Query j of the chunk sees keys 0 ..= ctx + j."""
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    group = num_heads // num_kv_heads
    block_size = k_cache.shape[1]
    if out is None:
        out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        q_start, q_end = starts[i], starts[i + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        ctx = seq_len - q_len
        blocks = block_tables[i, : (ctx + block_size - 1) // block_size].long()
        # keys, values: [seq_len, num_kv_heads, head_dim]
        keys = torch.cat([k_cache[blocks].flatten(0, 1)[:ctx], k[q_start:q_end]]).float()
        values = torch.cat([v_cache[blocks].flatten(0, 1)[:ctx], v[q_start:q_end]]).float()
        keys = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # [heads, seq_len, dim]
        values = values.repeat_interleave(group, dim=1).transpose(0, 1)
        qi = q[q_start:q_end].float().transpose(0, 1)  # [heads, q_len, dim]
        scores = torch.matmul(qi, keys.transpose(1, 2)) * scale  # [heads, q_len, seq_len]
        q_pos = torch.arange(ctx, seq_len, device=q.device)
        hidden = torch.arange(seq_len, device=q.device)[None, :] > q_pos[:, None]
        scores.masked_fill_(hidden, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[q_start:q_end] = torch.matmul(probs, values).transpose(0, 1).to(out.dtype)
    return out


# ---------------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def _dense_tile(
    q,  # [BLOCK_M, HEAD_DIM] query rows
    q_idx,  # [BLOCK_M] each row's query index in the chunk
    m_i,  # [BLOCK_M] running max (log2 domain)
    l_i,  # [BLOCK_M] running sum
    acc,  # [BLOCK_M, HEAD_DIM] float32 running P @ V
    n0,  # first key of this tile, as an index into the chunk
    kv_end,  # chunk keys < kv_end exist for this program
    k_seq_ptr,  # &k[q_start, kv_head, 0]
    v_seq_ptr,  # &v[q_start, kv_head, 0]
    k_desc,  # USE_TMA: k as [num_tokens, num_kv_heads * HEAD_DIM] in [BLOCK_N, HEAD_DIM] boxes
    v_desc,
    desc_row,  # USE_TMA: q_start (the chunk's first token)
    desc_col,  # USE_TMA: kv_head * HEAD_DIM
    qk_scale,
    stride_k_tok,
    stride_v_tok,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,  # False: every key of the tile is visible to every row
    USE_TMA: tl.constexpr,  # unmasked tiles through the bulk tensor copy engine (sm_90)
    UPCAST_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    LAZY: tl.constexpr = False,  # rescale only when a row's max grows past LAZY_THRESHOLD
):
    offs_n = n0 + tl.arange(0, BLOCK_N)  # [BLOCK_N] key index in the chunk
    offs_d = tl.arange(0, HEAD_DIM)
    # k[q_start + offs_n, kv_head, d] -> [BLOCK_N, HEAD_DIM] (int32 offsets: one chunk's span)
    k_ptrs = k_seq_ptr + offs_n[:, None] * stride_k_tok + offs_d[None, :]
    v_ptrs = v_seq_ptr + offs_n[:, None] * stride_v_tok + offs_d[None, :]
    if MASKED:  # keys past the tile's last query belong to later rows or other sequences
        k = tl.load(k_ptrs, mask=(offs_n < kv_end)[:, None], other=0.0)
    elif USE_TMA:
        k = k_desc.load([desc_row + n0, desc_col])
    else:
        k = tl.load(k_ptrs)
    if UPCAST_DOT:
        k = k.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N], unscaled
    if MASKED:
        s = tl.where(offs_n[None, :] <= q_idx[:, None], s, float("-inf"))  # causal
    # qk_scale > 0 commutes with max; key 0 (the first tile) is visible to every row, so m_new
    # is finite from the first tile on and a fully masked later row gets p = 0
    if LAZY:
        # one branch for the whole program (a scalar): the acc / l rescale (BLOCK_M x HEAD_DIM
        # multiplies) is skipped on the tiles where no row's max grows by more than the
        # threshold, most of them once the first tiles have set the max. The first tile always
        # rescales (m_i = -inf: the growth is +inf); a row without a visible key in this tile
        # grows by -inf. The max moves for every row at once, to the true running max.
        m_tile = tl.max(s, axis=1) * qk_scale
        if tl.max(m_tile - m_i, axis=0) > LAZY_THRESHOLD:
            m_new = tl.maximum(m_i, m_tile)
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha
            acc = acc * alpha[:, None]
        else:
            m_new = m_i
        p = tl.exp2(s * qk_scale - m_new[:, None])  # <= 2^LAZY_THRESHOLD
        l_i = l_i + tl.sum(p, axis=1)
    else:
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
        p = tl.exp2(s * qk_scale - m_new[:, None])  # one FMA per score
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
    if MASKED:
        v = tl.load(v_ptrs, mask=(offs_n < kv_end)[:, None], other=0.0)
    elif USE_TMA:
        v = v_desc.load([desc_row + n0, desc_col])
    else:
        v = tl.load(v_ptrs)
    if UPCAST_DOT:
        v = v.to(tl.float32)
    if not LAZY:
        acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


# Batch-dependent ints and index tensors are not specialised on (no mid-serving recompiles).
@triton.jit(
    do_not_specialize=["stride_bt_seq"],
    do_not_specialize_on_alignment=["block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr"],
)
def _dense_prefill_kernel(
    q_ptr,  # [num_tokens, num_heads, HEAD_DIM]
    k_ptr,  # [num_tokens, num_kv_heads, HEAD_DIM]
    v_ptr,  # [num_tokens, num_kv_heads, HEAD_DIM]
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    v_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq]
    seq_lens_ptr,  # [num_seqs]
    query_start_loc_ptr,  # [num_seqs + 1]
    out_ptr,  # [num_tokens, num_heads, HEAD_DIM]
    k_desc,  # USE_TMA: host tensor descriptors of k and v (else None)
    v_desc,
    qk_scale,  # softmax scale * log2(e)
    stride_q_tok,
    stride_q_head,
    stride_k_tok,
    stride_k_head,
    stride_v_tok,
    stride_v_head,
    stride_kc_block,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_block,
    stride_vc_slot,
    stride_vc_head,
    stride_bt_seq,
    stride_o_tok,
    stride_o_head,
    GROUP: tl.constexpr,  # query heads per KV head
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    BLOCK_M: tl.constexpr,  # (query, group head) rows per program
    BLOCK_N: tl.constexpr,  # keys per tile
    USE_TMA: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    LAZY: tl.constexpr = False,  # PrefillConfig.lazy: the chunk's key tiles rescale lazily
):
    kv_head = tl.program_id(0)
    seq = tl.program_id(1)
    tile = tl.num_programs(2) - 1 - tl.program_id(2)  # last (longest) tiles dispatch first

    # int32 whatever the metadata's dtype: token counts fit, and TMA offsets must be 32-bit
    q_start = tl.load(query_start_loc_ptr + seq).to(tl.int32)
    q_len = tl.load(query_start_loc_ptr + seq + 1).to(tl.int32) - q_start
    row_lo = tile * BLOCK_M
    if row_lo >= q_len * GROUP:  # this sequence has fewer rows (or is padding)
        return
    ctx_len = tl.load(seq_lens_ptr + seq).to(tl.int32) - q_len  # keys cached before this chunk

    offs_m = row_lo + tl.arange(0, BLOCK_M)  # [BLOCK_M] row = q_idx * GROUP + g
    offs_d = tl.arange(0, HEAD_DIM)
    q_idx = offs_m // GROUP  # query index within the chunk
    heads = kv_head * GROUP + offs_m % GROUP  # query head of each row
    row_mask = q_idx < q_len
    tok = (q_start + q_idx).to(tl.int64)  # packed token index

    # q[tok, heads, d] -> [BLOCK_M, HEAD_DIM]
    q_ptrs = q_ptr + tok[:, None] * stride_q_tok + heads[:, None] * stride_q_head + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_mask[:, None], other=0.0)
    if UPCAST_DOT:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    # 1. the cached prefix, keys [0, ctx_len) at positions < every query's: all visible; only
    #    the partial last tile masks (its bound). Nothing to do for a whole new prompt.
    bt_row_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    kc_base_ptr = k_cache_ptr + kv_head * stride_kc_head  # k_cache[:, :, kv_head, :]
    vc_base_ptr = v_cache_ptr + kv_head * stride_vc_head  # v_cache[:, :, kv_head, :]
    q_pos = ctx_len + q_idx  # position of each query in the sequence
    ctx_full_end = (ctx_len // BLOCK_N) * BLOCK_N
    m_i, l_i, acc = _attend_paged_keys(
        q, q_pos, m_i, l_i, acc, ctx_full_end, ctx_len, bt_row_ptr, kc_base_ptr, vc_base_ptr,
        qk_scale, stride_kc_block, stride_kc_slot, stride_vc_block, stride_vc_slot,
        HEAD_DIM, BLOCK_SIZE, BLOCK_N, False, UPCAST_DOT, DOT_PRECISION,
    )  # fmt: skip

    # 2. the chunk's own keys from k/v: [0, full_end) every row sees, [full_end, kv_end) cross
    #    the diagonal (kv_end: one past the tile's last real query)
    first_q = row_lo // GROUP
    kv_end = tl.minimum((row_lo + BLOCK_M - 1) // GROUP, q_len - 1) + 1
    full_end = ((first_q + 1) // BLOCK_N) * BLOCK_N
    k_seq_ptr = k_ptr + q_start.to(tl.int64) * stride_k_tok + kv_head * stride_k_head
    v_seq_ptr = v_ptr + q_start.to(tl.int64) * stride_v_tok + kv_head * stride_v_head
    for n0 in range(0, full_end, BLOCK_N):
        m_i, l_i, acc = _dense_tile(
            q, q_idx, m_i, l_i, acc, n0, kv_end, k_seq_ptr, v_seq_ptr, k_desc, v_desc, q_start,
            kv_head * HEAD_DIM, qk_scale, stride_k_tok, stride_v_tok,
            HEAD_DIM, BLOCK_N, False, USE_TMA, UPCAST_DOT, DOT_PRECISION, LAZY,
        )  # fmt: skip
    for n0 in range(full_end, kv_end, BLOCK_N):
        m_i, l_i, acc = _dense_tile(
            q, q_idx, m_i, l_i, acc, n0, kv_end, k_seq_ptr, v_seq_ptr, k_desc, v_desc, q_start,
            kv_head * HEAD_DIM, qk_scale, stride_k_tok, stride_v_tok,
            HEAD_DIM, BLOCK_N, True, USE_TMA, UPCAST_DOT, DOT_PRECISION, LAZY,
        )  # fmt: skip

    o = acc / l_i[:, None]  # l_i >= 1: each row's max key contributes exp2(0)
    # out[tok, heads, d]
    o_ptrs = (
        out_ptr + tok[:, None] * stride_o_tok + heads[:, None] * stride_o_head + offs_d[None, :]
    )
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])


# ---------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------
class PrefillConfig(NamedTuple):
    block_m: int  # (query, group head) rows per program; warp_spec: queries of one head
    block_n: int  # keys per tile
    num_warps: int  # warp_spec: per consumer warpgroup (4), the kernel runs three warpgroups
    num_stages: int  # software-pipelining depth of the key loops
    tma: bool = False  # unmasked chunk tiles through host tensor descriptors (bulk tensor copy)
    maxnreg: int | None = None  # registers per thread; 128 with 8 warps: two programs per SM
    warp_spec: bool = False  # dense_prefill_ws: producer / consumer warpgroups (16-bit only)
    lazy: bool = False  # rescale acc / l only when a row's max grows past LAZY_THRESHOLD


def config_label(cfg: PrefillConfig) -> str:
    """BLOCK_M/BLOCK_N/num_warps/num_stages and the variant's flags, e.g. '128/64/8/4 tma'."""
    flags = [" tma"] if cfg.tma else []
    flags += [f" r{cfg.maxnreg}"] if cfg.maxnreg else []
    flags += [" ws"] if cfg.warp_spec else []
    flags += [" lazy"] if cfg.lazy else []
    return "/".join(str(x) for x in cfg[:4]) + "".join(flags)


# 16-bit with head_dim <= 128 on sm_90: the warp-specialized kernel (dense_prefill_ws: a
# producer warpgroup loading K/V, two consumer warpgroups of 64 query rows each, 128-key tiles,
# two stages) for chunks of at least WS_MIN_QUERIES queries whose q/k/v the descriptors take
# (ws_ready); CONFIG_PLAIN (two warpgroups of wgmma over 128 packed (query, head) rows, 64-key
# tiles, cp.async pointer loads four stages deep) otherwise. H200 sweep of 2026-12-01
# (benchmarks/jobs/prefill_attn_sweep.sh, docs/benchmarks-log.md), 1 x 8192 causal, Llama-3.1-8B
# heads: ws 1.120 ms = 70.1 % of the bf16 matmul ceiling, CONFIG_PLAIN 1.191 ms = 65.9 %; ws is
# also ahead on 1 x 4096 (-9 %), 4 x 2048 (-9 %), 16 x 512 (-7 %) and 8,192 after 16,384 cached
# (-3 %), behind on short chunks after a cached prefix (4 x 512 after 3,584: +2 %; 16 x 128
# after 1,024: +11 %), hence the threshold.
CONFIG_16BIT = PrefillConfig(128, 128, 4, 2, warp_spec=True)
WS_MIN_QUERIES = 1024
CONFIG_PLAIN = PrefillConfig(128, 64, 8, 4)  # 16-bit where a warp_spec config cannot run
CONFIG_WIDE = PrefillConfig(64, 32, 4, 3)  # fp32, or head_dim > 128: tiles of twice the bytes
CONFIGS_TO_SWEEP = [
    PrefillConfig(128, 64, 8, 3), PrefillConfig(128, 64, 8, 4), PrefillConfig(128, 128, 8, 2),
    PrefillConfig(128, 128, 8, 3), PrefillConfig(128, 32, 8, 4),
    PrefillConfig(128, 64, 8, 3, True), PrefillConfig(128, 64, 8, 4, True),
    PrefillConfig(128, 128, 8, 2, True), PrefillConfig(128, 128, 8, 3, True),
    # 64-row tiles: two programs per multiprocessor fit in registers and shared memory
    PrefillConfig(64, 64, 4, 2), PrefillConfig(64, 64, 4, 3), PrefillConfig(64, 64, 4, 3, True),
    PrefillConfig(64, 128, 4, 2, True),
    # two stages: fewer registers (ptxas: 208 with the copy engine, 227 without, no spills)
    PrefillConfig(128, 64, 8, 2), PrefillConfig(128, 64, 8, 2, True),
    # 128 registers: two 8-warp programs per multiprocessor, one's softmax beside the other's
    # wgmma (32-key tiles: the only width that fits without spills or serialized wgmma)
    PrefillConfig(128, 32, 8, 2, True, 128), PrefillConfig(128, 32, 8, 3, True, 128),
    PrefillConfig(128, 32, 8, 2, False, 128),
    # lazy rescaling (LAZY_THRESHOLD): the fastest tiles of the 2026-12-01 sweep, without the
    # acc / l rescale on tiles where no row's max grows much
    PrefillConfig(128, 64, 8, 3, lazy=True), PrefillConfig(128, 64, 8, 4, lazy=True),
    PrefillConfig(128, 64, 8, 3, True, lazy=True), PrefillConfig(128, 128, 8, 2, lazy=True),
]  # fmt: skip
# dense_prefill_ws; with tma=False each program bounds its own descriptors (no host ones).
# 128 queries: two consumer warpgroups of 64 rows; 256 queries with 32-key tiles: of 128 rows
# Two stages only: with three or four (128/64/4/3, 128/64/4/3 tma, 128/64/4/4) Triton 3.6's
# pipeline returns NaN on the H200 (sweep and GPU tests of 2026-12-01), so they are left out.
CONFIGS_WARP_SPEC = [
    PrefillConfig(128, 128, 4, 2, warp_spec=True), PrefillConfig(128, 128, 4, 2, True, None, True),
    PrefillConfig(128, 64, 4, 2, warp_spec=True), PrefillConfig(128, 64, 4, 2, True, None, True),
    PrefillConfig(256, 32, 4, 2, warp_spec=True),
]  # fmt: skip


def default_config(dtype: torch.dtype, head_dim: int) -> PrefillConfig:
    return CONFIG_16BIT if dtype != torch.float32 and head_dim <= 128 else CONFIG_WIDE


def tma_ready(t: torch.Tensor) -> bool:
    """t [num_tokens, num_kv_heads, head_dim] can be described as a 2-D [num_tokens,
    num_kv_heads * head_dim] tensor for the copy engine (ws_ready) and has rows."""
    return t.shape[0] > 0 and ws_ready(t)


def dense_prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    scale: float,
    *,
    out: torch.Tensor | None = None,
    config: PrefillConfig | None = None,
) -> torch.Tensor:
    """Triton twin of `dense_prefill_attention_ref`.

    k/v: the step's new keys/values, row t belonging to query token t (the tensors store_kv
    writes into the cache). The cache must hold q's dtype (an FP8 cache: use
    paged_prefill_attention). max_query_len: host int >= every q_len (sizes the grid).
    Tokens after query_start_loc[-1] (CUDA-graph padding) are left untouched in `out`.
    config: for benchmarks and tests; None picks default_config (a TMA config falls back to
    pointer loads when k or v cannot be described, see tma_ready; a warp_spec one to
    CONFIG_PLAIN or CONFIG_WIDE for fp32, head_dim > 128, or q/k/v that fail ws_ready).
    """
    shape = check_paged_attention(q, k_cache, v_cache, block_tables, seq_lens)
    num_seqs, num_heads, num_kv_heads = shape.num_seqs, shape.num_heads, shape.num_kv_heads
    head_dim, block_size = shape.head_dim, shape.block_size
    if k_cache.dtype != q.dtype:
        raise ValueError(f"the cache must hold q's dtype {q.dtype}, got {k_cache.dtype}")
    for name, t in (("k", k), ("v", v)):
        check_tensor(name, t, ndim=3, dtypes=(q.dtype,), device=q.device)
        check_shape(name, t, (q.shape[0], num_kv_heads, head_dim))
        check_last_dim_contiguous(name, t)
    check_tensor("query_start_loc", query_start_loc, ndim=1, dtypes=INDEX_DTYPES, device=q.device)
    check_shape("query_start_loc", query_start_loc, (num_seqs + 1,))
    check_contiguous("query_start_loc", query_start_loc)
    max_query_len = host_int("max_query_len", max_query_len)
    out = output_buffer("out", out, tuple(q.shape), q)
    if num_seqs == 0 or max_query_len == 0 or num_heads == 0:
        return out
    check_launchable(q)

    group = num_heads // num_kv_heads
    upcast, precision = dot_config(q.dtype)
    cfg = config or default_config(q.dtype, head_dim)
    if cfg.warp_spec:
        wide = q.dtype == torch.float32 or head_dim > 128  # no 16-bit wgmma, or too big
        short = config is None and max_query_len < max(cfg.block_m, WS_MIN_QUERIES)
        # the default falls back to the plain kernel off Hopper (an explicit config does not)
        elsewhere = config is None and not ws_supported(q.device)
        if not (wide or short or elsewhere) and all(ws_ready(t) for t in (q, k, v)):
            merge_cfg = _short_tiles(CONFIG_PLAIN, max_query_len * group)
            launch_ws(
                q, k, v, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
                max_query_len, float(scale) * LOG2E, out, cfg, merge_cfg,
            )  # fmt: skip
            return out
        cfg = CONFIG_WIDE if wide else CONFIG_PLAIN
    if config is None:
        cfg = _short_tiles(cfg, max_query_len * group)
    BLOCK_M, BLOCK_N, num_warps, num_stages, tma = cfg[:5]
    k_desc = v_desc = None
    if tma and tma_ready(k) and tma_ready(v):
        k_desc, v_desc = descriptor_2d(k, BLOCK_N), descriptor_2d(v, BLOCK_N)
    grid = (num_kv_heads, num_seqs, triton.cdiv(max_query_len * group, BLOCK_M))
    _dense_prefill_kernel[grid](
        q, k, v, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out, k_desc, v_desc,
        float(scale) * LOG2E,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
        USE_TMA=k_desc is not None, UPCAST_DOT=upcast, DOT_PRECISION=precision, LAZY=cfg.lazy,
        num_warps=num_warps, num_stages=num_stages, **_maxnreg(cfg),
    )  # fmt: skip
    return out


def _short_tiles(cfg: PrefillConfig, rows: int) -> PrefillConfig:
    """Short chunks (fewer (query, group head) rows than a tile): small tiles."""
    if rows >= cfg.block_m:
        return cfg
    block_m = max(16, triton.next_power_of_2(rows))
    return cfg._replace(block_m=block_m, num_warps=4 if block_m < 128 else cfg.num_warps)


def _maxnreg(cfg: PrefillConfig) -> dict:
    return {"maxnreg": cfg.maxnreg} if cfg.maxnreg and not interpreting() else {}
