# Decode attention for rows that share a prefix of cache blocks (a shared system prompt): the
# prefix's K/V is read once per group of sequences, not once per sequence.
#   q, k_cache, v_cache, block_tables, seq_lens, k_scale, v_scale: as paged_decode_attention
#   groups (PrefixGroups, device tensors built on the host by engine/core/prefix_groups.py):
#     rows:        [num_groups, max_rows] int32, the sequences of each group, -1 = empty slot;
#                  a padding group is all -1
#     prefix_lens: [num_groups] int32, keys [0, prefix_len) every row of the group shares (its
#                  first row's block table is read for them); 0 in a padding group
#     key_start:   [num_seqs] int32, the row's group's prefix_len, 0 for a row in no group
#
# Three launches, all grids from host ints (CUDA-graph friendly):
#   1. the prefix kernel: one program per (group, KV head, prefix split); the query heads of
#      that KV head of every row in the group are the M side of the tl.dot (max_rows x GROUP,
#      padded to a power of two >= 16), so each prefix K/V tile is loaded and widened once for
#      all of them; it writes per-row partials (max, sum, acc) in float32, log2 domain, into
#      split slots [num_splits, num_splits + prefix_splits) of the shared scratch;
#   2. the suffix: paged_decode_attention's split kernel from key_start on, into slots
#      [0, num_splits) of the same scratch;
#   3. the merge: paged_decode_attention's reduce kernel over all num_splits + prefix_splits
#      slots (an LSE combine). The prefix slots of a row in no group are set to (-inf, 0)
#      beforehand and their acc is never read.
from dataclasses import dataclass

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
    output_buffer,
)
from kernels.fp8_quant import kv_scales
from kernels.paged_decode_attention import (
    FP8_WIDEN,
    FP8_WIDEN_CODES,
    LOG2E,
    MAX_USER_SPLITS,
    _decode_reduce_kernel,
    attend_key_range,
    paged_decode_attention,
    reduce_heads_per_program,
)


@dataclass(slots=True)
class PrefixGroups:
    rows: torch.Tensor  # [num_groups, max_rows] int32
    prefix_lens: torch.Tensor  # [num_groups] int32
    key_start: torch.Tensor  # [num_seqs] int32

    def __post_init__(self) -> None:
        if self.rows.ndim != 2 or self.prefix_lens.shape != (self.rows.shape[0],):
            raise ValueError(
                f"rows must be [groups, max_rows] and prefix_lens [groups], got "
                f"{tuple(self.rows.shape)} and {tuple(self.prefix_lens.shape)}"
            )
        for name in ("rows", "prefix_lens", "key_start"):
            t = getattr(self, name)
            if t.dtype != torch.int32 or not t.is_contiguous():
                raise ValueError(f"{name} must be a contiguous int32 tensor")

    @classmethod
    def from_host(cls, rows, prefix_lens, key_start, device: torch.device) -> "PrefixGroups":
        """From host int32 arrays (numpy or torch), e.g. engine/core/prefix_groups.py's."""
        return cls(*(torch.as_tensor(a).to(device) for a in (rows, prefix_lens, key_start)))


def shared_prefix_decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    groups: PrefixGroups,
    out: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Torch twin: each row attends to its keys, those before key_start read through its group's
    first row's block table (equal to paged_decode_attention_ref when the blocks are shared)."""
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
    tables = block_tables[:, :num_blocks].long()  # [num_seqs, num_blocks]
    leader = torch.arange(num_seqs, device=q.device)  # whose table holds a row's prefix
    for members in groups.rows.long():
        members = members[members >= 0]
        leader[members] = members[0] if len(members) else 0
    pos = torch.arange(num_blocks * block_size, device=q.device)
    own = tables[:, pos // block_size]  # [num_seqs, ctx] block of each key
    shared = tables[leader][:, pos // block_size]
    in_prefix = pos[None, :] < groups.key_start[:, None].long()
    blocks = torch.where(in_prefix, shared, own).clamp(min=0)  # -1 past the end: masked below
    # k, v: [num_seqs, ctx, num_kv_heads, head_dim]
    k = k_cache[blocks, pos % block_size].float() * k_scale
    v = v_cache[blocks, pos % block_size].float() * v_scale
    qg = q.float().view(num_seqs, num_kv_heads, group, head_dim)
    scores = torch.einsum("bhgd,bthd->bhgt", qg, k) * scale
    mask = pos[None, :] >= seq_lens[:, None].long()
    scores.masked_fill_(mask[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    o = torch.einsum("bhgt,bthd->bhgd", probs, v)
    out.copy_(o.reshape(num_seqs, num_heads, head_dim).to(out.dtype))
    return out


@triton.jit(
    do_not_specialize=["prefix_splits", "part_splits", "split_base", "stride_bt_seq"],
    do_not_specialize_on_alignment=["block_tables_ptr", "group_rows_ptr", "prefix_lens_ptr"],
)
def _prefix_split_kernel(
    q_ptr,  # [num_seqs, num_heads, HEAD_DIM]
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    v_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq]
    group_rows_ptr,  # [num_groups, MAX_ROWS] int32, -1 = empty
    prefix_lens_ptr,  # [num_groups] int32
    part_max_ptr,  # [num_seqs, num_heads, part_splits] float32 (log2 domain)
    part_sum_ptr,  # [num_seqs, num_heads, part_splits] float32
    part_acc_ptr,  # [num_seqs, num_heads, part_splits, HEAD_DIM] float32
    qk_scale,  # softmax scale * k_scale * log2(e)
    v_scale,
    num_heads,
    prefix_splits,
    part_splits,
    split_base,  # slot of prefix split 0
    stride_q_seq,
    stride_q_head,
    stride_kc_block,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_block,
    stride_vc_slot,
    stride_vc_head,
    stride_bt_seq,
    GROUP: tl.constexpr,  # query heads per KV head
    MAX_ROWS: tl.constexpr,  # sequences per group
    BLOCK_M: tl.constexpr,  # MAX_ROWS * GROUP padded to a power of two >= 16
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    KV_FP8: tl.constexpr,
    FP8_WIDEN: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    kv_head = tl.program_id(0)
    grp = tl.program_id(1)
    split = tl.program_id(2)

    prefix_len = tl.load(prefix_lens_ptr + grp)
    split_len = tl.cdiv(tl.cdiv(prefix_len, prefix_splits), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, prefix_len)

    offs_m = tl.arange(0, BLOCK_M)  # [BLOCK_M] row = member * GROUP + head in the group
    offs_d = tl.arange(0, HEAD_DIM)
    member = offs_m // GROUP
    seqs = tl.load(
        group_rows_ptr + grp * MAX_ROWS + member, mask=member < MAX_ROWS, other=-1
    )  # [BLOCK_M]
    m_mask = seqs >= 0
    seqs = tl.maximum(seqs, 0).to(tl.int64)
    heads = kv_head * GROUP + offs_m % GROUP  # [BLOCK_M]

    # q[seq, head, d] -> [BLOCK_M, HEAD_DIM]; empty slots load zeros
    q_ptrs = q_ptr + seqs[:, None] * stride_q_seq + heads[:, None] * stride_q_head + offs_d[None, :]
    q = tl.load(q_ptrs, mask=m_mask[:, None], other=0.0)
    if KV_FP8 and FP8_WIDEN != 0:
        q = q.to(tl.float16)  # as paged_decode_attention: e4m3 widens to fp16 in one cvt
    if UPCAST_DOT:
        q = q.to(tl.float32)

    # the group's first row's block table holds the shared blocks (padding groups: row 0,
    # never read since their range is empty)
    leader = tl.maximum(tl.load(group_rows_ptr + grp * MAX_ROWS), 0)
    bt_row_ptr = block_tables_ptr + leader.to(tl.int64) * stride_bt_seq
    m_i, l_i, acc = attend_key_range(
        q, k_cache_ptr, v_cache_ptr, kv_head * stride_kc_head, kv_head * stride_vc_head,
        bt_row_ptr, start, end, qk_scale, v_scale,
        stride_kc_block, stride_kc_slot, stride_vc_block, stride_vc_slot,
        ROWS=BLOCK_M, HEAD_DIM=HEAD_DIM, BLOCK_SIZE=BLOCK_SIZE, BLOCK_N=BLOCK_N, KV_FP8=KV_FP8,
        UPCAST_DOT=UPCAST_DOT, DOT_PRECISION=DOT_PRECISION,
    )  # fmt: skip

    # every (row, head, prefix split) of a group's rows is written, empty splits as (-inf, 0, 0)
    row = seqs * num_heads + heads  # [BLOCK_M] flat (seq, head)
    stat_offs = row * part_splits + split_base + split
    tl.store(part_max_ptr + stat_offs, m_i, mask=m_mask)
    tl.store(part_sum_ptr + stat_offs, l_i, mask=m_mask)
    acc_ptrs = part_acc_ptr + stat_offs[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(acc_ptrs, acc, mask=m_mask[:, None])


# (keys per tile, warps, stages) of the prefix kernel by BLOCK_M: its [BLOCK_M, head_dim]
# float32 accumulator grows with the rows. Untuned: benchmarks/shared_prefix_bench.py measures.
PREFIX_LAUNCH: dict[int, tuple[int, int, int]] = {16: (64, 4, 3), 32: (64, 4, 3), 64: (64, 4, 2)}
PREFIX_LAUNCH_WIDE = (32, 8, 2)  # BLOCK_M >= 128
# Over an e4m3 cache the prefix kernel doubles its keys per tile, up to this (the split kernel's
# e4m3 tile when shared_prefix_bench.py measured the pair, 2026-12-03).
PREFIX_FP8_MAX_BLOCK_N = 128


def prefix_launch(block_m: int, head_dim: int) -> tuple[int, int, int]:
    block_n, warps, stages = PREFIX_LAUNCH.get(block_m, PREFIX_LAUNCH_WIDE)
    return (block_n if head_dim <= 128 else min(block_n, 32)), warps, stages


def shared_prefix_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    groups: PrefixGroups,
    *,
    max_seq_len: int,
    num_splits: int = 1,
    prefix_splits: int = 1,
    out: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    seq_order: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton twin of `shared_prefix_decode_attention_ref`. num_splits: splits of each row's
    suffix (key_start ... seq_len); prefix_splits: splits of each group's prefix. The grid is
    made of host ints and the groups' tensor shapes, so a call with fixed bucket shapes can be
    captured in a CUDA graph and replayed with new group contents."""
    shape = check_paged_attention(q, k_cache, v_cache, block_tables, seq_lens)
    num_seqs, num_heads, num_kv_heads = shape.num_seqs, shape.num_heads, shape.num_kv_heads
    head_dim, block_size = shape.head_dim, shape.block_size
    device = q.device
    num_splits = host_int("num_splits", num_splits, minimum=1)
    prefix_splits = host_int("prefix_splits", prefix_splits, minimum=1)
    total_splits = num_splits + prefix_splits
    if total_splits > MAX_USER_SPLITS:
        raise ValueError(f"num_splits + prefix_splits must be <= {MAX_USER_SPLITS}")
    num_groups, max_rows = groups.rows.shape
    check_tensor("groups.rows", groups.rows, ndim=2, dtypes=(torch.int32,), device=device)
    check_tensor("groups.prefix_lens", groups.prefix_lens, ndim=1, device=device)
    check_shape("groups.key_start", groups.key_start, (num_seqs,))
    out = output_buffer("out", out, tuple(q.shape), q)
    if num_seqs == 0 or num_heads == 0:
        return out
    check_launchable(q)

    part_max = torch.empty((num_seqs, num_heads, total_splits), dtype=torch.float32, device=device)
    part_sum = torch.empty_like(part_max)
    part_acc = torch.empty(
        (num_seqs, num_heads, total_splits, head_dim), dtype=torch.float32, device=device
    )
    # rows in no group: their prefix slots are empty (the reduce skips the acc of a -inf max)
    part_max[:, :, num_splits:].fill_(float("-inf"))
    part_sum[:, :, num_splits:].zero_()

    paged_decode_attention(
        q, k_cache, v_cache, block_tables, seq_lens, scale,
        max_seq_len=max_seq_len, num_splits=num_splits, out=out, k_scale=k_scale, v_scale=v_scale,
        seq_order=seq_order, key_start=groups.key_start, partials=(part_max, part_sum, part_acc),
    )  # fmt: skip

    group = num_heads // num_kv_heads
    if num_groups and max_rows:
        kv_fp8 = k_cache.dtype == torch.float8_e4m3fn
        k_sc, v_sc = kv_scales(k_cache.dtype, k_scale, v_scale)
        widen = FP8_WIDEN_CODES[FP8_WIDEN] if kv_fp8 and q.dtype != torch.float32 else 0
        block_m = max(16, next_power_of_2(max_rows * group))
        block_n, warps, stages = prefix_launch(block_m, head_dim)
        if kv_fp8:  # an e4m3 tile is half the bytes: twice the keys for the same registers
            block_n = min(2 * block_n, PREFIX_FP8_MAX_BLOCK_N)
        upcast, precision = dot_config(q.dtype)
        _prefix_split_kernel[(num_kv_heads, num_groups, prefix_splits)](
            q, k_cache, v_cache, block_tables, groups.rows, groups.prefix_lens,
            part_max, part_sum, part_acc,
            float(scale) * k_sc * LOG2E, v_sc,
            num_heads, prefix_splits, total_splits, num_splits,
            q.stride(0), q.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            block_tables.stride(0),
            GROUP=group, MAX_ROWS=max_rows, BLOCK_M=block_m, HEAD_DIM=head_dim,
            BLOCK_SIZE=block_size, BLOCK_N=block_n, KV_FP8=kv_fp8, FP8_WIDEN=widen,
            UPCAST_DOT=upcast, DOT_PRECISION=precision, num_warps=warps, num_stages=stages,
        )  # fmt: skip

    block_h = reduce_heads_per_program(num_heads, group, total_splits)
    _decode_reduce_kernel[(num_seqs, triton.cdiv(num_heads, block_h))](
        part_max, part_sum, part_acc, out, num_heads, total_splits, out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, BLOCK_S=next_power_of_2(total_splits), BLOCK_H=block_h,
        num_warps=4 if head_dim >= 128 else 2,
    )  # fmt: skip
    return out
