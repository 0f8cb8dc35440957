# The other walks of paged_decode_attention's split kernel over one key range. The split kernel
# (kernels/paged_decode_attention.py: launcher, reduce, torch reference) picks one by its WALK
# constexpr; each walk returns the same (max, sum, acc) of the group's query heads, so the
# epilogue, the partials and the reduce are shared.
#
# Why: "keys" (attend_key_range) puts the GROUP query heads of a KV head on the M side of the
# dots, padded to 16 rows. At the 70B's group of 8 half of every score, exp2 and P row is
# padding, and over an e4m3 cache (half the bytes per key) that per-key work, not the bytes, sets
# the kernel's time.
#
# "blocks" (attend_key_lanes): the padding rows take keys of their own. The program's keys are
# dealt round robin to LANES lanes (key k to lane k % LANES) and query row r = lane * GROUP + h is
# head h of lane r // GROUP, so LANES * GROUP rows (16 at groups 2..8) are all real:
#   * q is stacked block-diagonally along the contraction: row r holds q[h] in column block
#     r // GROUP of a [rows, LANES * HEAD_DIM] operand, zeros elsewhere;
#   * a tile of BLOCK_N consecutive keys is read as [BLOCK_N / LANES, LANES * HEAD_DIM]: packed
#     row j is keys j * LANES ... j * LANES + LANES - 1 side by side (one cache block: the tile
#     starts at a multiple of LANES and LANES divides the block size);
#   * one dot gives scores [rows, BLOCK_N / LANES]: s[r, j] = q[h] . key(j * LANES + lane), every
#     entry a real (head, key) pair, so the masks, exp2 and row sums run on BLOCK_N / LANES columns
#     instead of BLOCK_N (a half at group 8, a quarter at 4). The dots' multiply count stays (the
#     zero blocks of q): the bet is that the tensor cores have room to spare and the
#     elementwise work per key does not;
#   * P goes back to [rows, BLOCK_N] with zeros outside each row's lane, times the plain V tile;
#   * each lane keeps its own online softmax; the lanes of a head merge once, at the end.
#
# "blocks_t" (attend_keys_transposed): the transposed products, keys on the M side:
# scores^T [BLOCK_N, COLS] = K [BLOCK_N, HEAD_DIM] @ q^T [HEAD_DIM, COLS] and
# acc^T [HEAD_DIM, COLS] += V^T [HEAD_DIM, BLOCK_N] @ P^T [BLOCK_N, COLS]. The group is the N side,
# which triton 3.6 takes from 1 (min_dot_size (1, 1, 16) for 16-bit operands) and the mma
# instruction holds natively at 8 columns (m16n8k16; wgmma n8): COLS = max(8, next_pow2(GROUP)),
# no padding at the 70B's 8, and 8 columns of 4 real at the 8B's. V^T is the first operand of
# the second product, which triton 3.6 cannot widen from e4m3 in the operand's layout (8-bit,
# M-major): each V tile is widened in registers and goes through shared memory as fp16 (32 KB a
# 128-key tile). Hence "blocks_ts": the scores transposed as above, then acc [COLS, HEAD_DIM] +=
# P [COLS, BLOCK_N] @ V as in "keys" (the group as M, padded to 16 in the mma; V staged as e4m3).
import triton
import triton.language as tl

from kernels._launch import is_power_of_2, next_power_of_2
from kernels.paged_kv_tile import key_slots, load_kv_tile

WALKS = ("keys", "blocks", "blocks_t", "blocks_ts")
WALK_CODES = {walk: code for code, walk in enumerate(WALKS)}
MAX_LANES = 4  # q stacked LANES times: [16, 4 * 128] fp16 is 32 registers a thread at 4 warps
T_MIN_COLS = 8  # blocks_t: the mma instruction's N


def walk_layout(walk: str, group: int, block_size: int) -> tuple[str, int, int]:
    """(walk that runs, output rows BLOCK_G, LANES) of the split kernel for this group and cache
    block size. "blocks" needs GROUP a power of two below 16 (rows reshape to [LANES, GROUP]) and
    whole packed rows inside a cache block: it runs as "keys" otherwise."""
    if walk not in WALK_CODES:
        raise ValueError(f"unknown decode walk {walk!r}; choose one of {WALKS}")
    if walk == "blocks":
        lanes = min(16 // group if group < 16 else 1, MAX_LANES, block_size & -block_size)
        if is_power_of_2(group) and lanes >= 2:
            return walk, group, lanes
        walk = "keys"
    if walk in ("blocks_t", "blocks_ts"):
        return walk, max(T_MIN_COLS, next_power_of_2(group)), 1
    return "keys", max(16, next_power_of_2(group)), 1


@triton.jit
def load_lane_q(
    q_ptr,  # q[seq, first head of the group, 0]
    stride_q_head,
    GROUP: tl.constexpr,
    LANES: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """→ [LANES * GROUP, LANES * HEAD_DIM]: row lane * GROUP + h holds q[h] in column block
    `lane`, zeros elsewhere (the block-diagonal operand of attend_key_lanes)."""
    offs_r = tl.arange(0, LANES * GROUP)
    offs_c = tl.arange(0, LANES * HEAD_DIM)
    on_lane = (offs_r // GROUP)[:, None] == (offs_c // HEAD_DIM)[None, :]
    # q[seq, h, d] at row (lane, h), column (lane, d)
    ptrs = q_ptr + (offs_r % GROUP)[:, None] * stride_q_head + (offs_c % HEAD_DIM)[None, :]
    return tl.load(ptrs, mask=on_lane, other=0.0)


@triton.jit
def attend_key_lanes(
    q,  # [LANES * GROUP, LANES * HEAD_DIM] block-diagonal (load_lane_q), in the dots' dtype
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    v_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    kv_head_off,  # kv_head * stride_kc_head
    v_head_off,  # kv_head * stride_vc_head
    bt_row_ptr,  # the block-table row of the range's keys
    start,  # keys [start, end)
    end,
    qk_scale,  # softmax scale * k_scale * log2(e)
    v_scale,
    stride_kc_block,
    stride_kc_slot,
    stride_vc_block,
    stride_vc_slot,
    GROUP: tl.constexpr,  # a power of two
    LANES: tl.constexpr,  # divides BLOCK_SIZE and BLOCK_N
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,  # keys per tile
    KV_FP8: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """→ (m [GROUP], l [GROUP], acc [GROUP, HEAD_DIM]) as attend_key_range's for the group's
    heads (-inf, 0, 0 for an empty range)."""
    ROWS: tl.constexpr = LANES * GROUP
    SUB_N: tl.constexpr = BLOCK_N // LANES  # packed rows of a tile
    offs_r = tl.arange(0, ROWS)
    lane_r = offs_r // GROUP  # [ROWS] each row's lane
    offs_j = tl.arange(0, SUB_N)
    offs_c = tl.arange(0, LANES * HEAD_DIM)
    lane_c = offs_c // HEAD_DIM  # [LANES * HEAD_DIM] each packed column's lane
    # k_cache[block, slot + lane, kv_head, d] of packed column (lane, d), past the row's slot
    k_col = lane_c * stride_kc_slot + offs_c % HEAD_DIM
    offs_n = tl.arange(0, BLOCK_N)
    lane_of_key = tl.arange(0, LANES)
    m_i = tl.full([ROWS], float("-inf"), dtype=tl.float32)  # running max per (lane, head)
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM], dtype=tl.float32)
    # from a multiple of LANES: a packed row's keys share a cache block (the keys before start
    # are the row's own, finite, and masked out of the scores)
    for n0 in range(start - start % LANES, end, BLOCK_N):
        row_key = n0 + offs_j * LANES  # [SUB_N] first key of each packed row
        block_ids = tl.load(bt_row_ptr + row_key // BLOCK_SIZE, mask=row_key < end, other=0)
        block_ids = block_ids.to(tl.int64)  # int64: block * stride overflows int32
        row_off = block_ids * stride_kc_block + (row_key % BLOCK_SIZE) * stride_kc_slot
        # packed K tile [SUB_N, LANES * HEAD_DIM]; zeros past the end, where a NaN would reach
        # every lane's score through the zero blocks of q
        k_ptrs = k_cache_ptr + kv_head_off + row_off[:, None] + k_col[None, :]
        k_mask = (row_key[:, None] + lane_c[None, :]) < end
        k = tl.load(k_ptrs, mask=k_mask, other=0.0)
        if KV_FP8:
            k = k.to(q.dtype)
        if UPCAST_DOT:
            k = k.to(tl.float32)
        # scores [ROWS, SUB_N], log2 domain: s[r, j] is row r's head against key
        # row_key[j] + lane_r
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        key_s = row_key[None, :] + lane_r[:, None]
        s = tl.where((key_s >= start) & (key_s < end), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # a lane can have no key in a tile (the range's edges): keep its state, no inf - inf
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_ref)
        p = tl.exp2(s - m_ref[:, None])  # [ROWS, SUB_N]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        # p over the tile's keys [ROWS, BLOCK_N]: key j * LANES + lane of row r is p[r, j] when
        # lane == lane_r, else 0
        on_lane = lane_of_key[None, None, :] == lane_r[:, None, None]  # [ROWS, 1, LANES]
        p_keys = tl.reshape(tl.where(on_lane, p[:, :, None], 0.0), [ROWS, BLOCK_N])
        # v_cache[block_ids, slot_offs, kv_head, d] -> [BLOCK_N, HEAD_DIM], keys n0 ... in order
        tok_mask, v_blocks, v_slots = key_slots(bt_row_ptr, n0 + offs_n, end, BLOCK_SIZE)
        v = load_kv_tile(
            v_cache_ptr, v_head_off, v_blocks, v_slots, tok_mask, stride_vc_block,
            stride_vc_slot, q, HEAD_DIM, KV_FP8, UPCAST_DOT,
        )  # fmt: skip
        pv = tl.dot(p_keys.to(v.dtype), v, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    # merge the lanes of each head: rows (lane, h) -> h
    m_lanes = tl.reshape(m_i, [LANES, GROUP])
    m = tl.max(m_lanes, axis=0)  # [GROUP]
    w = tl.exp2(m_lanes - tl.where(m == float("-inf"), 0.0, m)[None, :])  # 0 for empty lanes
    l = tl.sum(w * tl.reshape(l_i, [LANES, GROUP]), axis=0)
    acc = tl.sum(w[:, :, None] * tl.reshape(acc, [LANES, GROUP, HEAD_DIM]), axis=0)
    if KV_FP8:
        acc = acc * v_scale
    return m, l, acc


@triton.jit
def attend_keys_transposed(
    q_t,  # [HEAD_DIM, COLS] q^T in the dots' dtype; padding columns are zeros
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    v_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    kv_head_off,
    v_head_off,
    bt_row_ptr,
    start,  # keys [start, end)
    end,
    qk_scale,
    v_scale,
    stride_kc_block,
    stride_kc_slot,
    stride_vc_block,
    stride_vc_slot,
    COLS: tl.constexpr,  # the group's heads, padded to >= T_MIN_COLS
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    KV_FP8: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    TRANS_PV: tl.constexpr,  # blocks_t: V^T @ P^T; blocks_ts: P @ V, the group as M again
):
    """→ (m [COLS], l [COLS], acc [COLS, HEAD_DIM]) as attend_key_range's."""
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.full([COLS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([COLS], dtype=tl.float32)
    acc_t = tl.zeros([HEAD_DIM, COLS], dtype=tl.float32)  # (P @ V)^T
    for n0 in range(start, end, BLOCK_N):
        tok_mask, block_ids, slot_offs = key_slots(bt_row_ptr, n0 + offs_n, end, BLOCK_SIZE)
        k = load_kv_tile(
            k_cache_ptr, kv_head_off, block_ids, slot_offs, tok_mask, stride_kc_block,
            stride_kc_slot, q_t, HEAD_DIM, KV_FP8, UPCAST_DOT,
        )  # fmt: skip
        # scores^T [BLOCK_N, COLS], log2 domain; every tile holds >= 1 valid key
        s_t = tl.dot(k, q_t, input_precision=DOT_PRECISION) * qk_scale
        s_t = tl.where(tok_mask[:, None], s_t, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s_t, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p_t = tl.exp2(s_t - m_new[None, :])  # [BLOCK_N, COLS]
        l_i = l_i * alpha + tl.sum(p_t, axis=0)
        v = load_kv_tile(
            v_cache_ptr, v_head_off, block_ids, slot_offs, tok_mask, stride_vc_block,
            stride_vc_slot, q_t, HEAD_DIM, KV_FP8, UPCAST_DOT,
        )  # fmt: skip
        if TRANS_PV:
            pv_t = tl.dot(tl.trans(v), p_t.to(v.dtype), input_precision=DOT_PRECISION)
        else:
            pv_t = tl.trans(tl.dot(tl.trans(p_t).to(v.dtype), v, input_precision=DOT_PRECISION))
        acc_t = acc_t * alpha[None, :] + pv_t
        m_i = m_new
    if KV_FP8:
        acc_t = acc_t * v_scale
    return m_i, l_i, tl.trans(acc_t)
