# Causal attention of a packed batch of query chunks over the paged KV cache ("extend"/prefill).
#   q:               [num_tokens, num_heads, head_dim], sequences packed back to back
#   k_cache/v_cache: [num_blocks, block_size, num_kv_heads, head_dim]; the chunk's own K/V are
#                    already stored (store_kv runs first)
#   block_tables:    [num_seqs, max_blocks_per_seq] int32
#   seq_lens:        [num_seqs] int32, keys of each sequence after this step (cached + chunk)
#   query_start_loc: [num_seqs + 1] int32, cumulative query lengths
#   k_scale/v_scale: host floats; an FP8 (e4m3) cache holds K / k_scale and V / v_scale (a
#                    float cache ignores them)
# Query j of sequence i (0-based in its chunk) sits at position seq_len - q_len + j and sees
# keys 0 ..= that position. Decode is the q_len == 1 case; speculative verification is q_len > 1.
#
# Triton version (`paged_prefill_attention`): flash-attention style online softmax over the paged
# cache. Grid: (query-row tiles, num_seqs, num_kv_heads). GQA is packed into the M dimension: the
# rows of a sequence's chunk for one KV head are the (query, group head) pairs in order
# row = q_idx * GROUP + g, so each K/V tile is loaded once for the whole head group. A program
# first walks the key tiles every row of its tile can see in full (no masks), then the tiles
# that cross the causal diagonal (masked).
import torch
import triton
import triton.language as tl

from kernels._launch import (
    INDEX_DTYPES,
    check_contiguous,
    check_launchable,
    check_paged_attention,
    check_shape,
    check_tensor,
    dot_config,
    host_int,
    output_buffer,
)
from kernels.fp8_quant import kv_scales
from kernels.paged_decode_attention import reduce_partials


def paged_prefill_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    scale: float,
    out: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    num_heads = q.shape[1]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    k_scale, v_scale = kv_scales(k_cache.dtype, k_scale, v_scale)
    if out is None:
        out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for i, seq_len in enumerate(lens):
        q_start, q_end = starts[i], starts[i + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        num_blocks = (seq_len + block_size - 1) // block_size
        blocks = block_tables[i, :num_blocks].long()
        # k, v: [seq_len, num_kv_heads, head_dim] → [num_heads, seq_len, head_dim]
        k = k_cache[blocks].flatten(0, 1)[:seq_len].float() * k_scale
        v = v_cache[blocks].flatten(0, 1)[:seq_len].float() * v_scale
        k = k.repeat_interleave(group, dim=1).transpose(0, 1)
        v = v.repeat_interleave(group, dim=1).transpose(0, 1)
        qi = q[q_start:q_end].float().transpose(0, 1)  # [num_heads, q_len, head_dim]
        scores = torch.matmul(qi, k.transpose(1, 2)) * scale  # [num_heads, q_len, seq_len]
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        k_pos = torch.arange(seq_len, device=q.device)
        mask = k_pos[None, :] > q_pos[:, None]
        scores.masked_fill_(mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[q_start:q_end] = torch.matmul(probs, v).transpose(0, 1).to(out.dtype)
    return out


# ---------------------------------------------------------------------------------------------
# Triton kernels
# ---------------------------------------------------------------------------------------------
LOG2E = 1.4426950408889634


@triton.jit
def _attend_tile(
    q,  # [BLOCK_M, HEAD_DIM] query rows
    q_pos,  # [BLOCK_M] position of each row's query in its sequence
    m_i,  # [BLOCK_M] running max (log2 domain)
    l_i,  # [BLOCK_M] running sum
    acc,  # [BLOCK_M, HEAD_DIM] float32 running P @ V
    n0,  # first key position of this tile
    kv_end,  # keys < kv_end exist for this program
    bt_row_ptr,  # this sequence's row of the block table
    k_base_ptr,  # k_cache + kv_head * stride_kc_head
    v_base_ptr,  # v_cache + kv_head * stride_vc_head
    qk_scale,
    stride_kc_block,
    stride_kc_slot,
    stride_vc_block,
    stride_vc_slot,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,  # False: every key of the tile is visible to every row
    KV_FP8: tl.constexpr,  # e4m3 cache: tiles are converted to q's dtype after loading
    UPCAST_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    offs_tok = n0 + tl.arange(0, BLOCK_N)  # [BLOCK_N] key positions
    offs_d = tl.arange(0, HEAD_DIM)
    slot_offs = offs_tok % BLOCK_SIZE  # offset within the cache block
    if MASKED:
        tok_mask = offs_tok < kv_end
        # block_tables[seq, pos // BLOCK_SIZE], never past the last key
        block_ids = tl.load(bt_row_ptr + offs_tok // BLOCK_SIZE, mask=tok_mask, other=0)
    else:
        block_ids = tl.load(bt_row_ptr + offs_tok // BLOCK_SIZE)
    block_ids = block_ids.to(tl.int64)  # int64: block * stride overflows int32 on big caches
    # k_cache[block_ids, slot_offs, kv_head, d] -> [BLOCK_N, HEAD_DIM]
    k_ptrs = (
        k_base_ptr
        + block_ids[:, None] * stride_kc_block
        + slot_offs[:, None] * stride_kc_slot
        + offs_d[None, :]
    )
    # v_cache[block_ids, slot_offs, kv_head, d] -> [BLOCK_N, HEAD_DIM]
    v_ptrs = (
        v_base_ptr
        + block_ids[:, None] * stride_vc_block
        + slot_offs[:, None] * stride_vc_slot
        + offs_d[None, :]
    )
    if MASKED:
        k = tl.load(k_ptrs, mask=tok_mask[:, None], other=0.0)
    else:
        k = tl.load(k_ptrs)
    if KV_FP8:
        k = k.to(q.dtype)
    if UPCAST_DOT:
        k = k.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
    if MASKED:
        visible = (offs_tok[None, :] <= q_pos[:, None]) & tok_mask[None, :]  # causal
        s = tl.where(visible, s, float("-inf"))
    # each row sees >= 1 key of the first tile it processes, so m_new stays finite
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if MASKED:
        v = tl.load(v_ptrs, mask=tok_mask[:, None], other=0.0)
    else:
        v = tl.load(v_ptrs)
    if KV_FP8:
        v = v.to(q.dtype)
    if UPCAST_DOT:
        v = v.to(tl.float32)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _attend_paged_keys(
    q,
    q_pos,
    m_i,
    l_i,
    acc,  # as in _attend_tile
    full_end,  # keys [0, full_end) are visible to every row: tiles without masks
    key_end,  # keys [full_end, key_end): tiles masked by bound and causality
    bt_row_ptr,
    k_base_ptr,
    v_base_ptr,
    qk_scale,
    stride_kc_block,
    stride_kc_slot,
    stride_vc_block,
    stride_vc_slot,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    KV_FP8: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    key_start=0,  # a multiple of BLOCK_N: a split of the key range starts here
):
    """Keys [key_start, key_end) of one sequence's paged cache into the running softmax state,
    in two loops so the first needs no masks (full_end: a multiple of BLOCK_N)."""
    for n0 in range(key_start, full_end, BLOCK_N):
        m_i, l_i, acc = _attend_tile(
            q, q_pos, m_i, l_i, acc, n0, key_end, bt_row_ptr, k_base_ptr, v_base_ptr, qk_scale,
            stride_kc_block, stride_kc_slot, stride_vc_block, stride_vc_slot,
            HEAD_DIM, BLOCK_SIZE, BLOCK_N, False, KV_FP8, UPCAST_DOT, DOT_PRECISION,
        )  # fmt: skip
    for n0 in range(tl.maximum(full_end, key_start), key_end, BLOCK_N):
        m_i, l_i, acc = _attend_tile(
            q, q_pos, m_i, l_i, acc, n0, key_end, bt_row_ptr, k_base_ptr, v_base_ptr, qk_scale,
            stride_kc_block, stride_kc_slot, stride_vc_block, stride_vc_slot,
            HEAD_DIM, BLOCK_SIZE, BLOCK_N, True, KV_FP8, UPCAST_DOT, DOT_PRECISION,
        )  # fmt: skip
    return m_i, l_i, acc


# Batch-dependent ints and index tensors are not specialised on (no mid-serving recompiles).
@triton.jit(
    do_not_specialize=["stride_bt_seq"],
    do_not_specialize_on_alignment=["block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr"],
)
def _prefill_kernel(
    q_ptr,  # [num_tokens, num_heads, HEAD_DIM]
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    v_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq]
    seq_lens_ptr,  # [num_seqs]
    query_start_loc_ptr,  # [num_seqs + 1]
    out_ptr,  # [num_tokens, num_heads, HEAD_DIM]
    part_max_ptr,  # SPLIT: [num_tokens, num_heads, num_splits] float32, running max (log2)
    part_sum_ptr,  # SPLIT: [num_tokens, num_heads, num_splits] float32, sum of exp2(s - max)
    part_acc_ptr,  # SPLIT: [num_tokens, num_heads, num_splits, HEAD_DIM] float32, P @ V
    qk_scale,  # softmax scale * k_scale * log2(e)
    v_scale,  # FP8 cache: the output times this
    num_splits,  # key ranges per (tile, sequence, KV head): grid axis 2 is num_kv_heads * this
    stride_q_tok,
    stride_q_head,
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
    KV_FP8: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    SPLIT: tl.constexpr,  # num_splits > 1: write partials for the reduce kernel, not out
):
    tile = tl.program_id(0)
    seq = tl.program_id(1)
    kv_head = tl.program_id(2) // num_splits
    split = tl.program_id(2) % num_splits

    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    row_lo = tile * BLOCK_M
    if row_lo >= q_len * GROUP:  # this sequence has fewer rows (or is padding)
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx_len = seq_len - q_len  # keys cached before this chunk

    offs_m = row_lo + tl.arange(0, BLOCK_M)  # [BLOCK_M] row = q_idx * GROUP + g
    offs_d = tl.arange(0, HEAD_DIM)
    q_idx = offs_m // GROUP  # query index within the chunk
    heads = kv_head * GROUP + offs_m % GROUP  # query head of each row
    row_mask = q_idx < q_len
    q_pos = ctx_len + q_idx  # position of each query in the sequence
    tok = (q_start + q_idx).to(tl.int64)  # packed token index

    # q[tok, heads, d] -> [BLOCK_M, HEAD_DIM]
    q_ptrs = q_ptr + tok[:, None] * stride_q_tok + heads[:, None] * stride_q_head + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_mask[:, None], other=0.0)
    if UPCAST_DOT:
        q = q.to(tl.float32)

    # keys [0, full_end) are visible to every row of the tile; [full_end, kv_end) need masks
    first_pos = ctx_len + row_lo // GROUP
    last_pos = ctx_len + tl.minimum((row_lo + BLOCK_M - 1) // GROUP, q_len - 1)
    kv_end = last_pos + 1
    full_end = ((first_pos + 1) // BLOCK_N) * BLOCK_N

    # This split's keys [key_start, key_end): the sequence's keys cut into num_splits ranges of
    # whole tiles, clipped to what the tile's last row sees. A split past it attends nothing
    # and leaves (-inf, 0) partials, which the reduce weighs 0.
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    key_start = split * split_len
    key_end = tl.minimum(key_start + split_len, kv_end)
    full_end = tl.minimum(full_end, key_end)  # whole tiles when it ends before full_end

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    bt_row_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    k_base_ptr = k_cache_ptr + kv_head * stride_kc_head  # k_cache[:, :, kv_head, :]
    v_base_ptr = v_cache_ptr + kv_head * stride_vc_head  # v_cache[:, :, kv_head, :]
    m_i, l_i, acc = _attend_paged_keys(
        q, q_pos, m_i, l_i, acc, full_end, key_end, bt_row_ptr, k_base_ptr, v_base_ptr, qk_scale,
        stride_kc_block, stride_kc_slot, stride_vc_block, stride_vc_slot,
        HEAD_DIM, BLOCK_SIZE, BLOCK_N, KV_FP8, UPCAST_DOT, DOT_PRECISION, key_start,
    )  # fmt: skip
    if KV_FP8:
        acc = acc * v_scale
    if SPLIT:
        # partials[tok, head, split]: contiguous, as kernels/paged_decode_attention.py's reduce
        # reads them (its sequences are this launch's tokens)
        num_heads = (tl.num_programs(2) // num_splits) * GROUP
        stat = (tok * num_heads + heads) * num_splits + split
        tl.store(part_max_ptr + stat, m_i, mask=row_mask)
        tl.store(part_sum_ptr + stat, l_i, mask=row_mask)
        acc_ptrs = part_acc_ptr + stat[:, None] * HEAD_DIM + offs_d[None, :]
        tl.store(acc_ptrs, acc, mask=row_mask[:, None] & (l_i > 0)[:, None])
        return

    o = acc / l_i[:, None]  # l_i >= 1: each row's max key contributes exp2(0)
    # out[tok, heads, d]
    o_ptrs = (
        out_ptr + tok[:, None] * stride_o_tok + heads[:, None] * stride_o_head + offs_d[None, :]
    )
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])


# ---------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------
# Launch parameters (untuned defaults; benchmarks/kernel_bench/prefill.py measures them on a GPU).
BLOCK_M_16BIT = 128  # rows per program for bf16/fp16 with head_dim <= 128
BLOCK_M_32BIT = 64  # rows per program otherwise (fp32 tiles need twice the shared memory)
BLOCK_N_DEFAULT = 64  # keys per tile (32 when head_dim > 128)
NUM_STAGES = 3
MAX_SPLITS = 64  # the reduce kernel holds every split of a (token, head) at once
MIN_KEYS_PER_SPLIT = 512  # a split's walk below this is mostly its partials' traffic
PROGRAMS_PER_SM = 2


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    scale: float,
    *,
    out: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    num_splits: int = 1,
) -> torch.Tensor:
    """Triton twin of `paged_prefill_attention_ref` (causal varlen over the paged cache).

    max_query_len: host int >= every q_len (sizes the grid; query rows past it would be left
    unwritten). A generous bound is fine: the extra programs return at once.
    Tokens after query_start_loc[-1] (CUDA-graph padding) are left untouched in `out`, as in the
    reference, with num_splits 1; with more the reduce writes them as zeros. The grid depends
    only on host ints, so the call can be graph-captured.
    Sequences must satisfy q_len <= seq_len (the chunk's keys are already in the cache).
    num_splits: key ranges per (row tile, sequence, KV head), merged by the decode kernel's
    reduce. A short chunk over a long prefix fills few programs, each walking every key in turn
    (on an H100 a 74-token chunk at a 21k offset launched 24 on 132 SMs for the 8B and cost a
    step +23 ms); `prefill_num_splits` picks a count from host ints.
    """
    shape = check_paged_attention(q, k_cache, v_cache, block_tables, seq_lens)
    num_seqs, num_heads, num_kv_heads = shape.num_seqs, shape.num_heads, shape.num_kv_heads
    head_dim, block_size = shape.head_dim, shape.block_size
    check_tensor("query_start_loc", query_start_loc, ndim=1, dtypes=INDEX_DTYPES, device=q.device)
    check_shape("query_start_loc", query_start_loc, (num_seqs + 1,))
    check_contiguous("query_start_loc", query_start_loc)
    max_query_len = host_int("max_query_len", max_query_len)
    out = output_buffer("out", out, tuple(q.shape), q)
    if num_seqs == 0 or max_query_len == 0 or num_heads == 0:
        return out
    check_launchable(q)

    group = num_heads // num_kv_heads
    k_scale, v_scale = kv_scales(k_cache.dtype, k_scale, v_scale)
    rows = max_query_len * group  # (query, group head) rows of the longest chunk
    upcast, precision = dot_config(q.dtype)
    big_tile = q.dtype != torch.float32 and head_dim <= 128
    BLOCK_M = BLOCK_M_16BIT if big_tile else BLOCK_M_32BIT
    BLOCK_M = min(BLOCK_M, max(16, triton.next_power_of_2(rows)))  # short chunks: small tiles
    BLOCK_N = BLOCK_N_DEFAULT if head_dim <= 128 else 32
    num_splits = host_int("num_splits", num_splits)
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be in [1, {MAX_SPLITS}], got {num_splits}")
    num_tokens = q.shape[0]
    part_max = part_sum = part_acc = out  # unused without splits
    if num_splits > 1:
        part_max = torch.full(
            (num_tokens, num_heads, num_splits), float("-inf"), dtype=torch.float32, device=q.device
        )
        part_sum = torch.zeros_like(part_max)
        part_acc = torch.empty(
            (num_tokens, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
    grid = (triton.cdiv(rows, BLOCK_M), num_seqs, num_kv_heads * num_splits)
    _prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        out,
        part_max,
        part_sum,
        part_acc,
        float(scale) * float(k_scale) * LOG2E,
        float(v_scale),
        num_splits,
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
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        KV_FP8=k_cache.dtype == torch.float8_e4m3fn,
        UPCAST_DOT=upcast,
        DOT_PRECISION=precision,
        SPLIT=num_splits > 1,
        num_warps=8 if BLOCK_M >= 128 else 4,
        num_stages=NUM_STAGES,
    )
    if num_splits > 1:
        reduce_partials(part_max, part_sum, part_acc, out, group, num_splits)
    return out


def prefill_num_splits(
    num_seqs: int, max_query_len: int, max_seq_len: int, group: int, num_kv_heads: int,
    num_sms: int,
) -> int:  # fmt: skip
    """Splits so that the launch has ~PROGRAMS_PER_SM programs per SM when its chunks alone
    would leave SMs idle, each split keeping >= MIN_KEYS_PER_SPLIT keys of the longest
    sequence; 1 when the chunks fill the GPU or the sequences are short. Host ints only."""
    rows = max_query_len * group
    block_m = BLOCK_M_16BIT if rows >= BLOCK_M_16BIT else max(16, triton.next_power_of_2(rows))
    programs = triton.cdiv(rows, block_m) * num_seqs * num_kv_heads
    if programs >= num_sms:
        return 1
    wanted = triton.cdiv(PROGRAMS_PER_SM * num_sms, programs)
    return max(1, min(wanted, max_seq_len // MIN_KEYS_PER_SPLIT, MAX_SPLITS))
