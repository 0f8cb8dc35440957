# Warp-specialized variant of dense_prefill_attention for sm_90 (selected by
# PrefillConfig.warp_spec): Triton 3.6's automatic Hopper warp specialization turns the key loop
# into one producer warpgroup (copy-engine loads) and two consumer warpgroups of BLOCK_M / 2 rows
# each that synchronise through mbarriers only, so one warpgroup's softmax can overlap the
# other's wgmma (num_warps=4 is the consumer width: the kernel runs 12 warps).
#   q:     [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim]
#   out:   [num_tokens, num_heads, head_dim]; lse: [num_tokens, num_heads] float32 scratch
# What the pass accepts in Triton 3.6 shapes the design:
# * a single tl.range(warp_specialize=True) loop and no other loop in the kernel, every operand
#   through tensor descriptors (q included), no reshape of loaded tiles. Hence one program per
#   (query head, sequence, BLOCK_M queries) without GQA row packing, and the causal mask applied
#   to every tile (an in-loop branch turns the specialization off).
# * The cached prefix (seq_len > q_len) runs in a second kernel, _prefix_merge_kernel: it
#   attends over the prefix through the block table and merges with the chunk's result through
#   the chunk's log-sum-exp (base 2). Programs of prefix-free sequences return at once.
# * q's row coordinate must be an SSA value used by nothing else the pass slices (see the load
#   of q): the pass maps a load coordinate to coordinate + BLOCK_M / 2 throughout the second
#   consumer warpgroup, and an index tensor built on the same value gets offset twice.
# Descriptors: q always through one the program builds (the pass can halve its box, not a host
# descriptor's: that mismatch was the hang of the host-descriptor variants). k/v: HOST_DESC uses
# host TensorDescriptors over k/v seen as 2-D [num_tokens, num_kv_heads * head_dim]; a tile
# crossing a chunk's end is moved back to end there, so k/v rows past it (the next sequence, or
# padding that may hold NaN) are never read. Otherwise each program builds k/v descriptors
# bounded by its own chunk (the copy engine zero-fills past the end). In-kernel descriptors
# need triton.set_allocator (_ensure_allocator).

import torch
import triton
import triton.language as tl

from kernels._launch import capability, dot_config, interpreting
from kernels.paged_prefill_attention import _attend_paged_keys

# The running max starts here, not at -inf: finite, so exp2(s - m) and exp2(m_old - m_new) never
# meet -inf - -inf, and a row whose keys are all masked so far (or a tile fully masked for it)
# gets p = 0, alpha finite, l = 0 instead of NaN, whatever order the compiler evaluates them in.
# Far below any real scaled score (|q.k| * scale of finite 16-bit inputs), so exact otherwise.
M_FLOOR = tl.constexpr(-1.0e30)


# Batch-dependent index tensors are not specialised on (no mid-serving recompiles).
@triton.jit(do_not_specialize_on_alignment=["query_start_loc_ptr"])
def _ws_chunk_kernel(
    q_ptr,  # [num_tokens, num_heads, HEAD_DIM]
    k_ptr,  # [num_tokens, num_kv_heads, HEAD_DIM]
    v_ptr,
    out_ptr,  # [num_tokens, num_heads, HEAD_DIM]
    lse_ptr,  # [num_tokens, num_heads] float32: log2 of each row's softmax denominator, scaled
    k_desc,  # HOST_DESC: k as [num_tokens, num_kv_heads * HEAD_DIM] in [BLOCK_N, HEAD_DIM] boxes
    v_desc,
    query_start_loc_ptr,  # [num_seqs + 1]
    qk_scale,  # softmax scale * log2(e)
    stride_q_tok,
    stride_k_tok,
    stride_v_tok,
    stride_o_tok,
    stride_o_head,
    stride_lse_tok,
    GROUP: tl.constexpr,  # query heads per KV head
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,  # queries per program (one head)
    BLOCK_N: tl.constexpr,  # keys per tile
    HOST_DESC: tl.constexpr,
    WARP_SPEC: tl.constexpr,  # False: the same kernel, software-pipelined (diagnostics)
    UPCAST_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    head = tl.program_id(0)
    seq = tl.program_id(1)
    tile = tl.num_programs(2) - 1 - tl.program_id(2)  # last (longest) tiles dispatch first
    kv_head = head // GROUP
    q_start = tl.load(query_start_loc_ptr + seq).to(tl.int32)
    q_len = tl.load(query_start_loc_ptr + seq + 1).to(tl.int32) - q_start
    m0 = tile * BLOCK_M
    # else this sequence has fewer queries (or is padding); an if, not an early return: the warp
    # specialization pass takes structured control flow only
    if m0 < q_len:
        offs_m = m0 + tl.arange(0, BLOCK_M)  # [BLOCK_M] query index in the chunk
        # q through a descriptor built here, whatever HOST_DESC: the pass gives each consumer
        # warpgroup its half of the tile by shrinking the load's box to BLOCK_M / 2 rows and
        # offsetting its row coordinate, which it can do to a descriptor made in the kernel but
        # not to a host one (whose box stays BLOCK_M rows: the copy engine then writes twice
        # the bytes the mbarrier expects, past the half-tile buffer; the hang of the host
        # descriptor variants on the H200). Rows from the first token to the chunk's end; rows
        # past it read as zeros.
        q_view = tl.make_tensor_descriptor(
            q_ptr + head * HEAD_DIM, shape=[q_start + q_len, HEAD_DIM],
            strides=[stride_q_tok, 1], block_shape=[BLOCK_M, HEAD_DIM],
        )  # fmt: skip
        # The row coordinate is q_start + m0, a value of its own, never m0: the pass (Triton
        # 3.6, WSDataPartition) offsets a load's coordinate for the second warpgroup by mapping
        # that SSA value to value + BLOCK_M / 2 in everything it slices for that warpgroup. Were
        # it m0, the splat of m0 in offs_m would be offset too, on top of the arange it already
        # slices to [BLOCK_M / 2, BLOCK_M): the second warpgroup would mask and store rows m0 +
        # BLOCK_M ... (the next tile's first half, racing with it) and never its own (the H200's
        # prefill_ws_diagnose of 2026-12-02: rows pos % 128 >= 64 unwritten, rows < 64 racy).
        q = q_view.load([q_start + m0, 0])
        if not HOST_DESC:
            start = q_start.to(tl.int64)
            # [q_len, HEAD_DIM] views of this chunk's k/v: rows past its end read as zeros
            k_view = tl.make_tensor_descriptor(
                k_ptr + start * stride_k_tok + kv_head * HEAD_DIM, shape=[q_len, HEAD_DIM],
                strides=[stride_k_tok, 1], block_shape=[BLOCK_N, HEAD_DIM],
            )  # fmt: skip
            v_view = tl.make_tensor_descriptor(
                v_ptr + start * stride_v_tok + kv_head * HEAD_DIM, shape=[q_len, HEAD_DIM],
                strides=[stride_v_tok, 1], block_shape=[BLOCK_N, HEAD_DIM],
            )  # fmt: skip
        if UPCAST_DOT:
            q = q.to(tl.float32)

        m_i = tl.full([BLOCK_M], M_FLOOR, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        kv_end = tl.minimum(m0 + BLOCK_M, q_len)  # one past the last real query of the tile
        for n0 in tl.range(0, kv_end, BLOCK_N, warp_specialize=WARP_SPEC):
            if HOST_DESC:
                # the last tile moves back to end at kv_end, over keys an earlier tile counted
                # (masked below): it never reads a row past the chunk, which may be padding
                # holding anything (a weight of 0 does not cancel a NaN of V in P @ V). Rows
                # before the first token (negative) read as zeros, other sequences' are finite.
                n_ld = tl.minimum(n0, kv_end - BLOCK_N)
                k = k_desc.load([q_start + n_ld, kv_head * HEAD_DIM])
            else:
                n_ld = n0  # the chunk's own descriptors: rows past its end read as zeros
                k = k_view.load([n0, 0])
            if UPCAST_DOT:
                k = k.to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
            offs_n = n_ld + tl.arange(0, BLOCK_N)
            visible = offs_n[None, :] <= offs_m[:, None]  # causal
            if HOST_DESC:
                visible = visible & (offs_n >= n0)[None, :]
            s = tl.where(visible, s, float("-inf"))
            # key 0 is visible to every row, so m_new is a real score from the first tile on;
            # >= M_FLOOR in any case: a fully masked row or tile gives p = 0, never NaN
            m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
            p = tl.exp2(s * qk_scale - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if HOST_DESC:
                v = v_desc.load([q_start + n_ld, kv_head * HEAD_DIM])
            else:
                v = v_view.load([n0, 0])
            if UPCAST_DOT:
                v = v.to(tl.float32)
            acc = acc * alpha[:, None]
            acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
            m_i = m_new

        row_mask = offs_m < q_len
        tok = (q_start + offs_m).to(tl.int64)
        offs_d = tl.arange(0, HEAD_DIM)
        o_ptrs = out_ptr + tok[:, None] * stride_o_tok + head * stride_o_head + offs_d[None, :]
        # l_i >= 1 for every real row (its max key contributes exp2(0)); a row without a
        # visible key would give 0 / 0: 0 instead, and a log-sum-exp of -inf
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        o = acc / l_safe[:, None]
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])
        tl.store(lse_ptr + tok * stride_lse_tok + head, m_i + tl.log2(l_i), mask=row_mask)


# Batch-dependent ints and index tensors are not specialised on (no mid-serving recompiles).
@triton.jit(
    do_not_specialize=["stride_bt_seq"],
    do_not_specialize_on_alignment=["block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr"],
)
def _prefix_merge_kernel(
    q_ptr,  # [num_tokens, num_heads, HEAD_DIM]
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    v_cache_ptr,
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq]
    seq_lens_ptr,  # [num_seqs]
    query_start_loc_ptr,  # [num_seqs + 1]
    out_ptr,  # [num_tokens, num_heads, HEAD_DIM]: the chunk's result, merged in place
    lse_ptr,  # [num_tokens, num_heads] float32: the chunk's log2-sum-exp2
    qk_scale,
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
    stride_lse_tok,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    BLOCK_M: tl.constexpr,  # (query, group head) rows per program, row = q_idx * GROUP + g
    BLOCK_N: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    kv_head = tl.program_id(0)
    seq = tl.program_id(1)
    tile = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq).to(tl.int32)
    q_len = tl.load(query_start_loc_ptr + seq + 1).to(tl.int32) - q_start
    ctx_len = tl.load(seq_lens_ptr + seq).to(tl.int32) - q_len  # keys cached before the chunk
    row_lo = tile * BLOCK_M
    if (ctx_len <= 0) | (row_lo >= q_len * GROUP):
        return

    offs_m = row_lo + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_idx = offs_m // GROUP
    heads = kv_head * GROUP + offs_m % GROUP
    row_mask = q_idx < q_len
    tok = (q_start + q_idx).to(tl.int64)
    q_ptrs = q_ptr + tok[:, None] * stride_q_tok + heads[:, None] * stride_q_head + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_mask[:, None], other=0.0)
    if UPCAST_DOT:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], M_FLOOR, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    bt_row_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    kc_base_ptr = k_cache_ptr + kv_head * stride_kc_head
    vc_base_ptr = v_cache_ptr + kv_head * stride_vc_head
    q_pos = ctx_len + q_idx  # every prefix key is visible: only the last tile masks its bound
    ctx_full_end = (ctx_len // BLOCK_N) * BLOCK_N
    m_i, l_i, acc = _attend_paged_keys(
        q, q_pos, m_i, l_i, acc, ctx_full_end, ctx_len, bt_row_ptr, kc_base_ptr, vc_base_ptr,
        qk_scale, stride_kc_block, stride_kc_slot, stride_vc_block, stride_vc_slot,
        HEAD_DIM, BLOCK_SIZE, BLOCK_N, False, UPCAST_DOT, DOT_PRECISION,
    )  # fmt: skip

    # out = (acc + o_chunk * 2^lse_chunk) / (l + 2^lse_chunk), all relative to a common max
    o_ptrs = out_ptr + tok[:, None] * stride_o_tok + heads[:, None] * stride_o_head
    o_ptrs += offs_d[None, :]
    o_chunk = tl.load(o_ptrs, mask=row_mask[:, None], other=0.0).to(tl.float32)
    lse_chunk = tl.load(lse_ptr + tok * stride_lse_tok + heads, mask=row_mask, other=0.0)
    # m >= M_FLOOR: finite even where the chunk's log-sum-exp is -inf (a row without keys)
    m = tl.maximum(m_i, lse_chunk)
    w_prefix = tl.exp2(m_i - m)
    w_chunk = tl.exp2(lse_chunk - m)
    denom = l_i * w_prefix + w_chunk  # >= 1 for a real row: its max term is exp2(0)
    denom = tl.where(denom > 0.0, denom, 1.0)
    o = (acc * w_prefix[:, None] + o_chunk * w_chunk[:, None]) / denom[:, None]
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])


def ws_supported(device: torch.device) -> bool:
    """The warp-specialized kernel runs here: an sm_90 GPU (its in-kernel tensor descriptors
    and Triton 3.6's warp specialization were built and checked for Hopper only), or the
    interpreter."""
    if interpreting():
        return True
    if device.type != "cuda":
        return False
    return capability(device)[0] == 9


def ws_ready(t: torch.Tensor) -> bool:
    """t [num_tokens, heads, head_dim] can be read through descriptors of 2-D [tokens, heads *
    head_dim] views: heads adjacent, 16-byte aligned rows."""
    return (
        t.stride(2) == 1
        and t.stride(1) == t.shape[2]
        and t.data_ptr() % 16 == 0
        and (t.stride(0) * t.element_size()) % 16 == 0
    )


def _aligned_bytes(size: int, alignment: int, device) -> torch.Tensor:
    """`size` bytes starting at a multiple of `alignment` (the slice keeps its buffer alive)."""
    alignment = max(1, alignment)
    buf = torch.empty(size + alignment - 1, dtype=torch.int8, device=device)
    skip = -buf.data_ptr() % alignment
    return buf[skip : skip + size]


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    """Triton's allocator for the launch's global scratch: one tensor map per in-kernel
    descriptor and program, written by the kernel itself. On the current device and stream
    (Triton launches there); the caching allocator may hand the bytes to a later allocation
    once this launch is queued, which stream order makes safe."""
    return _aligned_bytes(size, alignment, torch.device("cuda", torch.cuda.current_device()))


def _ensure_allocator() -> None:
    """In-kernel descriptors live in a global scratch buffer that Triton asks an allocator for
    (set per thread: Triton keeps it in a ContextVar). One set by someone else is kept."""
    from triton.runtime import _allocation

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_scratch)


def descriptor_2d(t: torch.Tensor, block_rows: int):
    """A host descriptor over t [tokens, heads, head_dim] seen as [tokens, heads * head_dim],
    boxes of block_rows tokens (t must pass ws_ready)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    num_tokens, heads, head_dim = t.shape
    return TensorDescriptor(
        t, [num_tokens, heads * head_dim], [t.stride(0), 1], [block_rows, head_dim]
    )


def _lse_scratch(num_tokens: int, num_heads: int, device: torch.device) -> torch.Tensor:
    """The chunk's log2-sum-exp2 per (token, head); the chunk kernel writes every real row."""
    return torch.empty((num_tokens, num_heads), dtype=torch.float32, device=device)


def ws_chunk(q, k, v, query_start_loc, max_query_len, qk_scale, out, cfg, *, lse=None,
             warp_specialize=True) -> torch.Tensor:  # fmt: skip
    """The chunk kernel alone: attention of each chunk over its own keys into `out`, its
    log2-sum-exp2 into `lse` (a new scratch if None), which it returns. warp_specialize=False
    compiles the same kernel without the warp specialization
    (benchmarks/sweeps/prefill_ws_diagnose.py runs both)."""
    num_tokens, num_heads, head_dim = q.shape
    num_seqs, num_kv_heads = query_start_loc.shape[0] - 1, k.shape[1]
    upcast, precision = dot_config(q.dtype)
    if lse is None:
        lse = _lse_scratch(num_tokens, num_heads, q.device)
    host = cfg.tma
    descs = (descriptor_2d(k, cfg.block_n), descriptor_2d(v, cfg.block_n)) if host else (None, None)
    if not interpreting():
        _ensure_allocator()  # q's descriptor (and k/v's without host ones) is built in-kernel
    grid = (num_heads, num_seqs, triton.cdiv(max_query_len, cfg.block_m))
    _ws_chunk_kernel[grid](
        q, k, v, out, lse, *descs, query_start_loc, qk_scale,
        q.stride(0), k.stride(0), v.stride(0), out.stride(0), out.stride(1), lse.stride(0),
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, HOST_DESC=host, WARP_SPEC=warp_specialize, UPCAST_DOT=upcast,
        DOT_PRECISION=precision, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return lse


def ws_merge(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, max_query_len,
             qk_scale, out, lse, merge_cfg) -> None:  # fmt: skip
    """The prefix merge: sequences with a cached prefix attend over it and merge with the
    chunk's result in `out` through `lse`; programs of prefix-free sequences return at once."""
    num_heads, head_dim = q.shape[1:]
    num_seqs, num_kv_heads = seq_lens.shape[0], k_cache.shape[2]
    group = num_heads // num_kv_heads
    upcast, precision = dot_config(q.dtype)
    grid = (num_kv_heads, num_seqs, triton.cdiv(max_query_len * group, merge_cfg.block_m))
    _prefix_merge_kernel[grid](
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out, lse, qk_scale,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1), lse.stride(0),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=k_cache.shape[1], BLOCK_M=merge_cfg.block_m,
        BLOCK_N=merge_cfg.block_n, UPCAST_DOT=upcast, DOT_PRECISION=precision,
        num_warps=merge_cfg.num_warps, num_stages=merge_cfg.num_stages,
    )  # fmt: skip


def launch_ws(q, k, v, k_cache, v_cache, block_tables, seq_lens, query_start_loc, max_query_len,
              qk_scale, out, cfg, merge_cfg) -> None:  # fmt: skip
    """dense_prefill_attention's arguments, checked, and its PrefillConfig (cfg: the chunk
    kernel, merge_cfg: the prefix kernel's tiles): the chunk kernel, then the prefix merge."""
    lse = ws_chunk(q, k, v, query_start_loc, max_query_len, qk_scale, out, cfg)
    ws_merge(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, max_query_len,
             qk_scale, out, lse, merge_cfg)  # fmt: skip
