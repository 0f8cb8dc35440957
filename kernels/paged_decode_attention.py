# One query token per sequence attending to its whole paged context (the decode step).
#   q:               [num_seqs, num_heads, head_dim]
#   k_cache/v_cache: [num_blocks, block_size, num_kv_heads, head_dim]; the current token's K/V
#                    already stored
#   block_tables:    [num_seqs, max_blocks_per_seq] int32
#   seq_lens:        [num_seqs] int32, keys per sequence including the current token; a padded
#                    CUDA-graph row has seq_len 0 and its output is ignored (must not fault)
#   k_scale/v_scale: host floats; an FP8 (e4m3) cache holds K / k_scale and V / v_scale (a
#                    float cache ignores them)
#
# Triton version (`paged_decode_attention`): split-KV "flash decoding", GQA-aware.
#   * one program per (sequence, KV head, split); the query heads of that KV head's group are the
#     M dimension of a tl.dot (padded to 16 rows), so every K/V tile is loaded once per group;
#   * each sequence's context is cut into `num_splits` equal ranges (rounded up to BLOCK_N keys,
#     computed on the device from seq_len, so the grid depends only on host ints); each split
#     runs an online softmax over its range and writes partial (max, sum, acc) in float32;
#   * a reduce kernel rescales and sums the partials. With num_splits == 1 the split kernel
#     normalises and writes the output itself and the reduce launch is skipped.
#   * optional `key_start` (per-row first key) and `partials` (caller-owned scratch with more
#     split slots than this launch fills; the caller reduces) let kernels/shared_prefix_decode.py
#     run the suffix pass after a shared prefix through this kernel.
#   * how a program walks its range is a choice (WALK for a 16-bit cache, FP8_WALK for e4m3):
#     "keys" (attend_key_range below, the group as the dots' M rows), or kernels/
#     paged_decode_walks.py's "blocks" (the padding rows take keys of their own), "blocks_t"
#     (keys as M, the group as N) and "blocks_ts" (only the scores so).
import math

import torch
import triton
import triton.language as tl

from kernels._launch import (
    check_launchable,
    check_paged_attention,
    check_shape,
    check_tensor,
    dot_config,
    host_int,
    next_power_of_2,
    num_sms,
    output_buffer,
)
from kernels.fp8_quant import kv_scales
from kernels.paged_decode_walks import (
    WALK_CODES,
    attend_key_lanes,
    attend_keys_transposed,
    load_lane_q,
    walk_layout,
)
from kernels.paged_kv_tile import key_slots, load_kv_tile


def paged_decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    k_scale, v_scale = kv_scales(k_cache.dtype, k_scale, v_scale)
    if out is None:
        out = torch.empty_like(q)
    max_len = int(seq_lens.max().item()) if num_seqs else 0
    if max_len == 0:
        out.zero_()
        return out
    num_blocks = (max_len + block_size - 1) // block_size
    blocks = block_tables[:, :num_blocks].long()
    # k, v: [num_seqs, num_blocks * block_size, num_kv_heads, head_dim]
    k = k_cache[blocks].flatten(1, 2).float() * k_scale
    v = v_cache[blocks].flatten(1, 2).float() * v_scale
    # qg: [num_seqs, num_kv_heads, group, head_dim]
    qg = q.float().view(num_seqs, num_kv_heads, group, head_dim)
    scores = torch.einsum("bhgd,bthd->bhgt", qg, k) * scale
    pos = torch.arange(k.shape[1], device=q.device)
    mask = pos[None, :] >= seq_lens[:, None].long()  # [num_seqs, ctx]
    scores.masked_fill_(mask[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows with seq_len 0 → zeros
    o = torch.einsum("bhgt,bthd->bhgd", probs, v)
    out.copy_(o.reshape(num_seqs, num_heads, head_dim).to(out.dtype))
    return out


# ---------------------------------------------------------------------------------------------
# Triton kernels
# ---------------------------------------------------------------------------------------------
LOG2E = 1.4426950408889634


# The tile loop of both decode kernels (this file's split kernel, shared_prefix_decode.py's
# prefix kernel): an online softmax of ROWS query rows over one key range of one block-table row.
@triton.jit
def attend_key_range(
    q,  # [ROWS, HEAD_DIM] in the dots' dtype; padding rows are zeros
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    v_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    kv_head_off,  # kv_head * stride_kc_head: this KV head's keys
    v_head_off,  # kv_head * stride_vc_head
    bt_row_ptr,  # the block-table row that maps the range's positions to cache blocks
    start,  # keys [start, end) of that row
    end,
    qk_scale,  # softmax scale * k_scale * log2(e): scores go straight to exp2
    v_scale,  # FP8 cache: the accumulated P @ V times this
    stride_kc_block,
    stride_kc_slot,
    stride_vc_block,
    stride_vc_slot,
    ROWS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    BLOCK_N: tl.constexpr,  # keys per tile
    KV_FP8: tl.constexpr,  # e4m3 cache: tiles are widened to q's dtype after loading
    UPCAST_DOT: tl.constexpr,  # interpreter only: dot in float32 (numpy has no bf16)
    DOT_PRECISION: tl.constexpr,
):
    """→ (m [ROWS] running max (log2 domain), l [ROWS] sum of exp2(s - m), acc [ROWS, HEAD_DIM]
    unnormalised P @ V times v_scale for an e4m3 cache; float32). An empty range gives (-inf,
    0, 0)."""
    offs_n = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    m_i = tl.full([ROWS], float("-inf"), dtype=tl.float32)  # running max
    l_i = tl.zeros([ROWS], dtype=tl.float32)  # running sum of exp2
    acc = tl.zeros([ROWS, HEAD_DIM], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        tok_mask, block_ids, slot_offs = key_slots(bt_row_ptr, n0 + offs_n, end, BLOCK_SIZE)
        k = load_kv_tile(
            k_cache_ptr, kv_head_off, block_ids, slot_offs, tok_mask, stride_kc_block,
            stride_kc_slot, q, HEAD_DIM, KV_FP8, UPCAST_DOT,
        )  # fmt: skip
        # scores [ROWS, BLOCK_N] in the log2 domain
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        s = tl.where(tok_mask[None, :], s, float("-inf"))
        # every tile holds >= 1 valid key (n0 < end), so m_new is finite
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)  # rescales the old state; 0 on the first tile
        p = tl.exp2(s - m_new[:, None])  # [ROWS, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = load_kv_tile(
            v_cache_ptr, v_head_off, block_ids, slot_offs, tok_mask, stride_vc_block,
            stride_vc_slot, q, HEAD_DIM, KV_FP8, UPCAST_DOT,
        )  # fmt: skip
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    if KV_FP8:
        acc = acc * v_scale
    return m_i, l_i, acc


# Batch-dependent ints and index tensors are not specialised on: otherwise each new value's
# divisibility or pointer alignment triggers a fresh compile in the middle of serving.
@triton.jit(
    do_not_specialize=["num_splits", "part_splits", "stride_bt_seq"],
    do_not_specialize_on_alignment=[
        "block_tables_ptr",
        "seq_lens_ptr",
        "seq_order_ptr",
        "key_start_ptr",
    ],
)
def _decode_split_kernel(
    q_ptr,  # [num_seqs, num_heads, HEAD_DIM]
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    v_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq]
    seq_lens_ptr,  # [num_seqs]
    seq_order_ptr,  # [num_seqs] int32: the row the i-th program row takes (HAS_ORDER only)
    key_start_ptr,  # [num_seqs] int32: first key of each row's range (HAS_KEY_START only)
    out_ptr,  # [num_seqs, num_heads, HEAD_DIM] (written only when NUM_SPLITS_IS_ONE)
    part_max_ptr,  # [num_seqs, num_heads, part_splits] float32, running max (log2 domain)
    part_sum_ptr,  # [num_seqs, num_heads, part_splits] float32, sum of exp2(s - max)
    part_acc_ptr,  # [num_seqs, num_heads, part_splits, HEAD_DIM] float32, unnormalised P @ V
    qk_scale,  # softmax scale * k_scale * log2(e): scores go straight to exp2
    v_scale,  # FP8 cache: the accumulated P @ V times this
    num_heads,
    num_splits,
    part_splits,  # split slots per (seq, head) in the partials: num_splits, or more (key_start)
    stride_q_seq,
    stride_q_head,
    stride_kc_block,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_block,
    stride_vc_slot,
    stride_vc_head,
    stride_bt_seq,
    stride_o_seq,
    stride_o_head,
    GROUP: tl.constexpr,  # query heads per KV head
    BLOCK_G: tl.constexpr,  # the walk's output rows, >= GROUP (walk_layout)
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    BLOCK_N: tl.constexpr,  # keys per tile
    NUM_SPLITS_IS_ONE: tl.constexpr,
    HAS_ORDER: tl.constexpr,
    HAS_KEY_START: tl.constexpr,
    KV_FP8: tl.constexpr,  # e4m3 cache: tiles are widened to q's dtype after loading
    FP8_WIDEN: tl.constexpr,  # 0: to q's dtype; 1: to fp16 (q too: one cvt per pair)
    UPCAST_DOT: tl.constexpr,  # interpreter only: dot in float32 (numpy has no bf16)
    DOT_PRECISION: tl.constexpr,
    WALK: tl.constexpr,  # WALK_CODES: 0 keys, 1 blocks, 2 blocks_t, 3 blocks_ts
    LANES: tl.constexpr,  # blocks: lanes of the program's keys (walk_layout)
):
    # KV heads vary fastest in the launch order: a sequence's heads run side by side and read
    # the same cache pages (a slot holds all heads) while they are open in DRAM. With an order,
    # rows go longest first, so the last wave holds the short rows (a shorter tail).
    kv_head = tl.program_id(0)
    seq = tl.program_id(1)
    split = tl.program_id(2)
    if HAS_ORDER:
        seq = tl.load(seq_order_ptr + seq)

    seq_len = tl.load(seq_lens_ptr + seq)
    key_start = 0
    if HAS_KEY_START:
        key_start = tl.load(key_start_ptr + seq)  # <= seq_len
    # This split's key range [start, end): ceil((seq_len - key_start) / num_splits) rounded up
    # to whole tiles. A split past the end (short sequence, padding row with seq_len 0) gets an
    # empty range.
    split_len = tl.cdiv(tl.cdiv(seq_len - key_start, num_splits), BLOCK_N) * BLOCK_N
    start = key_start + split * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_g = tl.arange(0, BLOCK_G)  # [BLOCK_G] row in the group
    offs_d = tl.arange(0, HEAD_DIM)  # [HEAD_DIM]
    g_mask = offs_g < GROUP
    heads = kv_head * GROUP + offs_g  # [BLOCK_G] query head of each row

    if WALK == 1:
        # [LANES * GROUP, LANES * HEAD_DIM], q stacked block-diagonally once per lane
        q_group_ptr = q_ptr + seq * stride_q_seq + kv_head * GROUP * stride_q_head
        q = load_lane_q(q_group_ptr, stride_q_head, GROUP=GROUP, LANES=LANES, HEAD_DIM=HEAD_DIM)
    else:
        # q[seq, heads, d] -> [BLOCK_G, HEAD_DIM]; padding rows load zeros
        q_ptrs = q_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head + offs_d[None, :]
        q = tl.load(q_ptrs, mask=g_mask[:, None], other=0.0)
    if KV_FP8 and FP8_WIDEN != 0:
        # e4m3 widens to fp16 exactly in one instruction per pair (to bf16 it takes a detour
        # through fp16 or fp32); e4m3's range (448) and q's fit fp16, and P in [0, 1] gains bits
        q = q.to(tl.float16)
    if UPCAST_DOT:
        q = q.to(tl.float32)

    # this sequence's block-table row
    bt_row_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    # m_i, l_i [BLOCK_G], acc [BLOCK_G, HEAD_DIM]: row g is the group's head g
    if WALK == 1:
        m_i, l_i, acc = attend_key_lanes(
            q, k_cache_ptr, v_cache_ptr, kv_head * stride_kc_head, kv_head * stride_vc_head,
            bt_row_ptr, start, end, qk_scale, v_scale,
            stride_kc_block, stride_kc_slot, stride_vc_block, stride_vc_slot,
            GROUP=GROUP, LANES=LANES, HEAD_DIM=HEAD_DIM, BLOCK_SIZE=BLOCK_SIZE, BLOCK_N=BLOCK_N,
            KV_FP8=KV_FP8, UPCAST_DOT=UPCAST_DOT, DOT_PRECISION=DOT_PRECISION,
        )  # fmt: skip
    elif WALK >= 2:
        m_i, l_i, acc = attend_keys_transposed(
            tl.trans(q), k_cache_ptr, v_cache_ptr, kv_head * stride_kc_head,
            kv_head * stride_vc_head, bt_row_ptr, start, end, qk_scale, v_scale,
            stride_kc_block, stride_kc_slot, stride_vc_block, stride_vc_slot,
            COLS=BLOCK_G, HEAD_DIM=HEAD_DIM, BLOCK_SIZE=BLOCK_SIZE, BLOCK_N=BLOCK_N,
            KV_FP8=KV_FP8, UPCAST_DOT=UPCAST_DOT, DOT_PRECISION=DOT_PRECISION,
            TRANS_PV=WALK == 2,
        )  # fmt: skip
    else:
        m_i, l_i, acc = attend_key_range(
            q, k_cache_ptr, v_cache_ptr, kv_head * stride_kc_head, kv_head * stride_vc_head,
            bt_row_ptr, start, end, qk_scale, v_scale,
            stride_kc_block, stride_kc_slot, stride_vc_block, stride_vc_slot,
            ROWS=BLOCK_G, HEAD_DIM=HEAD_DIM, BLOCK_SIZE=BLOCK_SIZE, BLOCK_N=BLOCK_N,
            KV_FP8=KV_FP8, UPCAST_DOT=UPCAST_DOT, DOT_PRECISION=DOT_PRECISION,
        )  # fmt: skip

    if NUM_SPLITS_IS_ONE:
        # out[seq, heads, d]; an empty context (seq_len 0) gives zeros, like the reference
        o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        o_ptrs = out_ptr + seq * stride_o_seq + heads[:, None] * stride_o_head + offs_d[None, :]
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])
    else:
        # partials are contiguous: part_max[seq, heads, split], part_acc[seq, heads, split, d].
        # Every (seq, head, split) is written, empty splits as (-inf, 0, 0), so the reduce
        # kernel never reads uninitialised scratch.
        row = seq.to(tl.int64) * num_heads + heads  # [BLOCK_G] flat (seq, head) index
        stat_offs = row * part_splits + split  # [BLOCK_G]
        tl.store(part_max_ptr + stat_offs, m_i, mask=g_mask)
        tl.store(part_sum_ptr + stat_offs, l_i, mask=g_mask)
        acc_ptrs = part_acc_ptr + stat_offs[:, None] * HEAD_DIM + offs_d[None, :]
        tl.store(acc_ptrs, acc, mask=g_mask[:, None])


@triton.jit(do_not_specialize=["num_splits"])
def _decode_reduce_kernel(
    part_max_ptr,  # [num_seqs, num_heads, num_splits] float32
    part_sum_ptr,  # [num_seqs, num_heads, num_splits] float32
    part_acc_ptr,  # [num_seqs, num_heads, num_splits, HEAD_DIM] float32
    out_ptr,  # [num_seqs, num_heads, HEAD_DIM]
    num_heads,
    num_splits,
    stride_o_seq,
    stride_o_head,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,  # num_splits rounded up to a power of two
    BLOCK_H: tl.constexpr,  # heads per program: one program per (seq, BLOCK_H heads)
):
    seq = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H]
    offs_s = tl.arange(0, BLOCK_S)  # [BLOCK_S]
    offs_d = tl.arange(0, HEAD_DIM)  # [HEAD_DIM]
    h_mask = offs_h < num_heads
    hs_mask = h_mask[:, None] & (offs_s < num_splits)[None, :]  # [BLOCK_H, BLOCK_S]

    # flat (seq, head, split) index of part_max / part_sum: [BLOCK_H, BLOCK_S]
    rows = (seq.to(tl.int64) * num_heads + offs_h)[:, None] * num_splits + offs_s[None, :]
    m = tl.load(part_max_ptr + rows, mask=hs_mask, other=float("-inf"))
    l = tl.load(part_sum_ptr + rows, mask=hs_mask, other=0.0)
    m_max = tl.max(m, axis=1)  # [BLOCK_H]
    # all splits empty (seq_len 0): use 0 as the reference so no (-inf) - (-inf) NaN appears
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp2(m - m_max[:, None])  # [BLOCK_H, BLOCK_S]; 0 for empty splits (m == -inf)
    total = tl.sum(w * l, axis=1)  # [BLOCK_H]
    # part_acc[seq, head, s, d] -> [BLOCK_H, BLOCK_S, HEAD_DIM]
    acc_ptrs = part_acc_ptr + rows[:, :, None] * HEAD_DIM + offs_d[None, None, :]
    # an empty split's acc is not read: a caller's scratch (shared-prefix slots of a row outside
    # any group) holds only its max (-inf) and sum (0)
    acc_mask = hs_mask & (m > float("-inf"))
    acc = tl.load(acc_ptrs, mask=acc_mask[:, :, None], other=0.0)
    o = tl.sum(w[:, :, None] * acc, axis=1)  # [BLOCK_H, HEAD_DIM]
    o = o / tl.where(total > 0.0, total, 1.0)[:, None]
    # out[seq, head, d]
    o_ptrs = out_ptr + seq * stride_o_seq + offs_h[:, None] * stride_o_head + offs_d[None, :]
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=h_mask[:, None])


# ---------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------
# Launch parameters (untuned defaults; benchmarks/kernel_bench/decode.py measures them on a GPU).
BLOCK_N_DEFAULT = 64  # keys per tile (32 when head_dim > 128)
NUM_WARPS = 4
NUM_STAGES = 3
# (keys per tile, warps, stages) for an e4m3 cache; None: the 16-bit values above. A tile of
# e4m3 keys is half the bytes of a 16-bit one for the same per-key work (the dot over the group,
# exp2), so the kernel is bound by that work, not by bytes, and its tile is tuned with its walk
# (below): on the H200 at the 70B's heads "blocks_t" reads fastest at 64 keys / 4 warps / 3
# stages, "keys" at 128 / 4 / 2 (decode_fp8_variants_70b_h200_2026-12-05.json).
FP8_LAUNCH: tuple[int, int, int] | None = (64, 4, 3)
# How e4m3 tiles widen for the dots: "q" (q's dtype), "fp16" (q and the tiles in fp16: a cvt per
# pair, one instruction, where bf16 takes a detour). On the H200 at the 70B's heads (benchmarks/
# decode_fp8_sweep.py, 2026-12-03) "fp16" took 10-14 % less time than "q"; integer shifts into
# fp16's bit layout were slower than both and are gone.
FP8_WIDEN = "fp16"
FP8_WIDEN_CODES = {"q": 0, "fp16": 1}
# How a program walks its key range (kernels/paged_decode_walks.py: WALKS), for a 16-bit and for
# an e4m3 cache. A walk becomes FP8_WALK when its GPU tests pass and benchmarks/sweeps/
# decode_fp8_sweep.py --walks finds its e4m3 geomean >= 1.15x the bf16 "keys" kernel at the 70B's
# heads, every shape faster: "blocks_t" at 64:4:3, 2026-12-05 (1.19x; 0.116 / 0.219 / 0.221 ms
# per layer at 64 x 2k / 128 x 2k / 256 x 1k against "keys" at its best tile 0.120 / 0.230 /
# 0.235).
WALK = "keys"
FP8_WALK = "blocks_t"
MAX_SPLITS = 64  # cap of the automatic choice
MAX_USER_SPLITS = 256  # cap of an explicit num_splits (the reduce kernel holds all of them)
MIN_KEYS_PER_SPLIT = 256  # below this a split is mostly launch/reduce overhead
PROGRAMS_PER_SM = 2  # the split heuristic aims for this many programs per SM
# balanced_num_splits: ~3 waves of programs, each split >= 400 keys of a mean row; a long row
# cut so that its ranges are <= 1/2.5 of a program slot's keys. (The engine launches the rows
# longest first, so the last wave is short rows already; before that order the rule needed ~12
# waves and 1/3.)
SPREAD_WAVES = 3
SPREAD_MIN_KEYS = 400
STRAGGLER_FACTOR = 2.5
# The reduce kernel: one program per (sequence, a few heads); its [heads, splits, head_dim]
# float32 tile stays at <= REDUCE_MAX_ROWS rows of head_dim. One head per program made 8,192
# programs of 2 KB each at batch 256 x 4 splits (0.8 TB/s on the H200).
REDUCE_BLOCK_H: int | None = None
REDUCE_MAX_ROWS = 64


def reduce_heads_per_program(num_heads: int, group: int, num_splits: int) -> int:
    """Heads one reduce program combines: REDUCE_BLOCK_H (None: one KV head's query group), a
    power of two, halved until its (head, split) rows are <= REDUCE_MAX_ROWS."""
    h = next_power_of_2(min(REDUCE_BLOCK_H or group, num_heads))
    while h > 1 and h * next_power_of_2(num_splits) > REDUCE_MAX_ROWS:
        h //= 2
    return h


def decode_launch(head_dim: int, kv_fp8: bool) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages) of the split kernel for this head size and cache."""
    if kv_fp8 and FP8_LAUNCH is not None:
        block_n, warps, stages = FP8_LAUNCH
        return (block_n if head_dim <= 128 else min(block_n, 64)), warps, stages
    return (BLOCK_N_DEFAULT if head_dim <= 128 else 32), NUM_WARPS, NUM_STAGES


def choose_num_splits(
    num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms_: int = 132
) -> int:
    """Splits per sequence so that the grid has ~PROGRAMS_PER_SM programs per SM, each split
    with >= MIN_KEYS_PER_SPLIT keys. Pure host arithmetic on host ints.
    """
    programs = max(1, num_seqs * num_kv_heads)
    target = PROGRAMS_PER_SM * num_sms_
    if programs >= target:
        return 1
    wanted = triton.cdiv(target, programs)
    useful = max(1, triton.cdiv(max(0, max_seq_len), MIN_KEYS_PER_SPLIT))
    return max(1, min(wanted, useful, MAX_SPLITS))


def balanced_num_splits(
    seq_lens: list[int],
    num_kv_heads: int,
    num_sms_: int = 132,
    candidates: list[int] | None = None,
) -> int:
    """Splits for a batch whose rows differ in length: the largest of
      * choose_num_splits' count (enough programs to fill the GPU at all);
      * enough programs for ~SPREAD_WAVES waves of PROGRAMS_PER_SM per SM, so the programs of
        uneven rows even out, while a split keeps >= SPREAD_MIN_KEYS keys of a mean row (each
        range pays the pipeline's start and its share of the reduce);
      * STRAGGLER_FACTOR x longest / (keys per program slot): a long row's range must be short
        beside what every slot does anyway, or the kernel waits for it.
    Assumes the rows launch longest first (seq_order, as the engine passes it). Measured on an
    H200 (benchmarks/sweeps/decode_split_sweep.py, rows longest first): from batch 96 to 256
    with rows uniform in [c/2, 3c/2] for c = 400 ... 8,000 one split is fastest or within 2 %
    (batch 128 of [350, 1050]: 0.102 ms a layer, 2 splits with the reduce 0.110); batch 96 with
    rows of 2,400 and one of 30,000 needs 16 (0.341 ms; 1 split 0.945). With `candidates` (counts
    captured in CUDA graphs, ascending): the smallest that reaches the count, else the largest.
    """
    if not seq_lens:
        return candidates[0] if candidates else 1
    longest, total, num_seqs = max(seq_lens), sum(seq_lens), len(seq_lens)
    fill = choose_num_splits(num_seqs, num_kv_heads, longest, num_sms_)
    slots = PROGRAMS_PER_SM * num_sms_
    spread = min(
        triton.cdiv(SPREAD_WAVES * slots, num_seqs * num_kv_heads),
        max(1, total // num_seqs // SPREAD_MIN_KEYS),
    )
    slot_keys = max(1, total * num_kv_heads // slots)  # keys each program slot walks
    straggler = math.ceil(STRAGGLER_FACTOR * longest / slot_keys)
    useful = max(1, triton.cdiv(longest, MIN_KEYS_PER_SPLIT))  # few rows: nothing to balance
    wanted = min(MAX_SPLITS, max(fill, min(max(spread, straggler), useful)))
    if candidates:
        return next((c for c in candidates if c >= wanted), candidates[-1])
    return wanted


def split_ladder(num_seqs: int, num_kv_heads: int, max_seq_len: int) -> list[int]:
    """Split counts to capture per batch size: the even-lengths choice and x2, x4, x8, x16 of it
    (balanced_num_splits picks among them per step)."""
    base = choose_num_splits(num_seqs, num_kv_heads, max_seq_len)
    useful = max(1, triton.cdiv(max_seq_len, MIN_KEYS_PER_SPLIT))
    return sorted({min(base * f, MAX_SPLITS, max(base, useful)) for f in (1, 2, 4, 8, 16)})


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    max_seq_len: int,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    seq_order: torch.Tensor | None = None,
    key_start: torch.Tensor | None = None,
    partials: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Triton twin of `paged_decode_attention_ref` (split-KV, GQA-aware).

    seq_order: optional int32 [num_seqs], a permutation of the rows in the order their programs
    should start (longest context first shortens the kernel's tail); the output is the same.

    max_seq_len: host int, an upper bound of the seq_lens. It only sizes the automatic split
    count (num_splits=None) and is checked against the block table width; correctness never
    depends on it: each split's key range is computed on the device from that row's seq_len.
    The grid is (num_kv_heads, num_seqs, num_splits), made of host ints only, so the call can be
    captured in a CUDA graph (with num_splits=None the count is fixed by the max_seq_len seen
    at capture). The float32 scratch for the partials (num_splits > 1) is allocated per call,
    from the graph's private pool under capture.

    key_start: optional int32 [num_seqs], each row's first key (<= its seq_len); the keys
    before it are left out. partials: optional float32 (max [num_seqs, num_heads, S], sum
    [same], acc [num_seqs, num_heads, S, head_dim]) with S >= num_splits: the splits write
    their partials into slots [0, num_splits), `out` is not written and the caller reduces
    (kernels/shared_prefix_decode.py).
    """
    shape = check_paged_attention(q, k_cache, v_cache, block_tables, seq_lens)
    check_shape("seq_lens", seq_lens, (q.shape[0],))  # one query token per sequence
    num_seqs, num_heads, num_kv_heads = shape.num_seqs, shape.num_heads, shape.num_kv_heads
    head_dim, block_size = shape.head_dim, shape.block_size
    device = q.device
    max_seq_len = host_int("max_seq_len", max_seq_len)
    if max_seq_len > block_tables.shape[1] * block_size:
        raise ValueError(
            f"max_seq_len {max_seq_len} exceeds the block table capacity "
            f"({block_tables.shape[1]} blocks x {block_size})"
        )
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_seq_len, num_sms(device))
    num_splits = host_int("num_splits", num_splits, minimum=1)
    if num_splits > MAX_USER_SPLITS:
        raise ValueError(f"num_splits must be <= {MAX_USER_SPLITS}, got {num_splits}")
    out = output_buffer("out", out, tuple(q.shape), q)
    if num_seqs == 0 or num_heads == 0:
        return out
    check_launchable(q)

    group = num_heads // num_kv_heads
    k_scale, v_scale = kv_scales(k_cache.dtype, k_scale, v_scale)
    kv_fp8 = k_cache.dtype == torch.float8_e4m3fn
    walk, BLOCK_G, lanes = walk_layout(FP8_WALK if kv_fp8 else WALK, group, block_size)
    BLOCK_N, num_warps, num_stages = decode_launch(head_dim, kv_fp8)
    # fp32 q keeps fp32 dots
    widen = FP8_WIDEN_CODES[FP8_WIDEN] if kv_fp8 and q.dtype != torch.float32 else 0
    upcast, precision = dot_config(q.dtype)
    if partials is not None:
        part_max, part_sum, part_acc = partials
        part_splits = part_max.shape[2]
        if part_splits < num_splits:
            raise ValueError(f"partials hold {part_splits} splits, fewer than {num_splits}")
        check_shape("partials max", part_max, (num_seqs, num_heads, part_splits))
        check_shape("partials sum", part_sum, (num_seqs, num_heads, part_splits))
        check_shape("partials acc", part_acc, (num_seqs, num_heads, part_splits, head_dim))
    elif num_splits > 1:
        part_splits = num_splits
        part_max = torch.empty(
            (num_seqs, num_heads, num_splits), dtype=torch.float32, device=device
        )
        part_sum = torch.empty_like(part_max)
        part_acc = torch.empty(
            (num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32, device=device
        )
    else:
        part_splits = 1
        part_max = part_sum = part_acc = out  # unused placeholders
    if seq_order is not None:
        check_tensor("seq_order", seq_order, ndim=1, dtypes=(torch.int32,), device=device)
        check_shape("seq_order", seq_order, (num_seqs,))
    if key_start is not None:
        check_tensor("key_start", key_start, ndim=1, dtypes=(torch.int32,), device=device)
        check_shape("key_start", key_start, (num_seqs,))
    _decode_split_kernel[(num_kv_heads, num_seqs, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        seq_lens if seq_order is None else seq_order,
        seq_lens if key_start is None else key_start,
        out,
        part_max,
        part_sum,
        part_acc,
        float(scale) * float(k_scale) * LOG2E,
        float(v_scale),
        num_heads,
        num_splits,
        part_splits,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=group,
        BLOCK_G=BLOCK_G,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_N=BLOCK_N,
        NUM_SPLITS_IS_ONE=num_splits == 1 and partials is None,
        HAS_ORDER=seq_order is not None,
        HAS_KEY_START=key_start is not None,
        KV_FP8=kv_fp8,
        FP8_WIDEN=widen,
        UPCAST_DOT=upcast,
        DOT_PRECISION=precision,
        WALK=WALK_CODES[walk],
        LANES=lanes,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if num_splits > 1 and partials is None:
        reduce_partials(part_max, part_sum, part_acc, out, group, num_splits)
    return out


def reduce_partials(
    part_max: torch.Tensor,  # [rows, num_heads, num_splits] float32, contiguous
    part_sum: torch.Tensor,  # [rows, num_heads, num_splits] float32, contiguous
    part_acc: torch.Tensor,  # [rows, num_heads, num_splits, head_dim] float32, contiguous
    out: torch.Tensor,  # [rows, num_heads, head_dim]; rows: sequences here, tokens in prefill
    group: int,
    num_splits: int,
) -> None:
    """out[r, h] = the softmax-weighted merge of the num_splits partials of (r, h)."""
    rows, num_heads, head_dim = out.shape
    block_h = reduce_heads_per_program(num_heads, group, num_splits)
    _decode_reduce_kernel[(rows, triton.cdiv(num_heads, block_h))](
        part_max,
        part_sum,
        part_acc,
        out,
        num_heads,
        num_splits,
        out.stride(0),
        out.stride(1),
        HEAD_DIM=head_dim,
        BLOCK_S=next_power_of_2(num_splits),
        BLOCK_H=block_h,
        num_warps=4 if head_dim >= 128 else 2,
    )
