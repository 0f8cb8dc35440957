# Rotary position embedding and the paged KV-cache write in one pass: what kernels/rotary.py and
# kernels/store_kv.py do one after the other, as one launch. Every attention layer of every step
# ran both (two small kernels, two graph nodes); on an H200 decode step at batch 128 they took
# 0.14 ms of ~9 ms plus two kernel boundaries each per layer.
#   q:               [num_tokens, num_heads, head_dim], rotated in place
#   k:               [num_tokens, num_kv_heads, head_dim], rotated in place, then stored
#   v:               [num_tokens, num_kv_heads, head_dim], stored
#   positions:       [num_tokens] int32/int64
#   cos_sin_cache:   [max_position, head_dim] float32, cos in [:, :head_dim//2], sin in the rest
#   k_cache/v_cache: [num_blocks, block_size, num_kv_heads, head_dim]
#   slot_mapping:    [num_tokens] int64, slot = block_id * block_size + offset; < 0 = skip
# The cache gets k as rotated and rounded to k's dtype (what store_kv would read back), so the
# result is the two references' exactly; an e4m3 cache quantizes it as store_kv does.
import torch
import triton
import triton.language as tl

from kernels._launch import (
    check_launchable,
    interpreting,
)
from kernels.fp8_quant import FP8_DTYPE, round_to_e4m3
from kernels.rotary import _rotate_heads, apply_rotary_ref, check_rotary, rotary_tiles
from kernels.store_kv import check_cache_write, store_kv_ref


def rotary_store_kv_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    apply_rotary_ref(q, k, positions, cos_sin_cache)
    store_kv_ref(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    return q, k


# ---------------------------------------------------------------------------------------------
# Triton kernel. One program per token: the token's cos/sin row once, the query heads rotated in
# place (rotary's own loop), then the KV heads in tiles of [BLOCK_H, HALF] pairs: k rotated,
# written back and, unless the slot is negative (CUDA-graph padding), into the cache with v.
# ---------------------------------------------------------------------------------------------
@triton.jit
def _cache_value(x, scale, QUANTIZE: tl.constexpr, ROUND_IN_FP32: tl.constexpr):
    """x as the cache holds it, before the cast to the cache dtype (e4m3: divided by the scale,
    clamped and rounded onto the e4m3 grid, as store_kv does)."""
    if QUANTIZE:
        x = round_to_e4m3(tl.clamp(x.to(tl.float32) / scale, -448.0, 448.0), ROUND_IN_FP32)
    return x


@triton.jit(do_not_specialize_on_alignment=["positions_ptr", "slot_mapping_ptr"])
def _rotary_store_kv_kernel(
    q_ptr,  # [num_tokens, num_heads, head_dim]
    k_ptr,  # [num_tokens, num_kv_heads, head_dim]
    v_ptr,  # [num_tokens, num_kv_heads, head_dim]
    positions_ptr,  # [num_tokens]
    cos_sin_ptr,  # [max_position, head_dim]: cos in [:, :HALF], sin in [:, HALF:]
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, head_dim]
    slot_mapping_ptr,  # [num_tokens]
    k_scale,  # e4m3 cache: stored = value / scale
    v_scale,
    num_heads,
    num_kv_heads,
    stride_q_tok,
    stride_q_head,
    stride_k_tok,
    stride_k_head,
    stride_v_tok,
    stride_v_head,
    stride_cs_pos,
    stride_kc_block,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_block,
    stride_vc_slot,
    stride_vc_head,
    HALF: tl.constexpr,  # head_dim // 2
    BLOCK_HALF: tl.constexpr,  # HALF rounded up to a power of two
    BLOCK_H: tl.constexpr,  # heads per tile
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    QUANTIZE: tl.constexpr,  # the cache is e4m3
    ROUND_IN_FP32: tl.constexpr,  # interpreter: see fp8_quant.round_to_e4m3
):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + tok).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF]
    d_mask = offs_d < HALF
    # cos_sin[pos, d] and cos_sin[pos, HALF + d]
    cos = tl.load(cos_sin_ptr + pos * stride_cs_pos + offs_d, mask=d_mask, other=0.0)
    sin = tl.load(cos_sin_ptr + pos * stride_cs_pos + HALF + offs_d, mask=d_mask, other=0.0)
    cos = cos.to(tl.float32)
    sin = sin.to(tl.float32)
    _rotate_heads(q_ptr + tok * stride_q_tok, num_heads, stride_q_head, cos, sin,
                  HALF, BLOCK_HALF, BLOCK_H)  # fmt: skip

    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    block_id = slot // BLOCK_SIZE  # int64: block * stride overflows int32 on big caches
    block_off = slot % BLOCK_SIZE
    for h0 in range(0, num_kv_heads, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)  # [BLOCK_H]
        mask = (offs_h[:, None] < num_kv_heads) & d_mask[None, :]  # [BLOCK_H, BLOCK_HALF]
        # k[tok, h, d] (x1) and k[tok, h, HALF + d] (x2)
        k1_ptrs = k_ptr + tok * stride_k_tok + offs_h[:, None] * stride_k_head + offs_d[None, :]
        x1 = tl.load(k1_ptrs, mask=mask, other=0.0)
        x2 = tl.load(k1_ptrs + HALF, mask=mask, other=0.0)
        x1f = x1.to(tl.float32)
        x2f = x2.to(tl.float32)
        o1 = (x1f * cos[None, :] - x2f * sin[None, :]).to(x1.dtype)
        o2 = (x2f * cos[None, :] + x1f * sin[None, :]).to(x2.dtype)
        tl.store(k1_ptrs, o1, mask=mask)
        tl.store(k1_ptrs + HALF, o2, mask=mask)
        if slot >= 0:
            # k_cache[block_id, block_off, h, d] and [..., HALF + d]
            kc_ptrs = (
                k_cache_ptr
                + block_id * stride_kc_block
                + block_off * stride_kc_slot
                + offs_h[:, None] * stride_kc_head
                + offs_d[None, :]
            )
            kc_dtype = k_cache_ptr.dtype.element_ty
            k1 = _cache_value(o1, k_scale, QUANTIZE, ROUND_IN_FP32)
            k2 = _cache_value(o2, k_scale, QUANTIZE, ROUND_IN_FP32)
            tl.store(kc_ptrs, k1.to(kc_dtype), mask=mask)
            tl.store(kc_ptrs + HALF, k2.to(kc_dtype), mask=mask)
            # v[tok, h, :] -> v_cache[block_id, block_off, h, :], in the same two halves
            v_ptrs = v_ptr + tok * stride_v_tok + offs_h[:, None] * stride_v_head + offs_d[None, :]
            vc_ptrs = (
                v_cache_ptr
                + block_id * stride_vc_block
                + block_off * stride_vc_slot
                + offs_h[:, None] * stride_vc_head
                + offs_d[None, :]
            )
            vc_dtype = v_cache_ptr.dtype.element_ty
            for part in tl.static_range(2):
                x = tl.load(v_ptrs + part * HALF, mask=mask, other=0.0)
                x = _cache_value(x, v_scale, QUANTIZE, ROUND_IN_FP32)
                tl.store(vc_ptrs + part * HALF, x.to(vc_dtype), mask=mask)


def rotary_store_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of `rotary_store_kv_ref`: rotates q and k in place, writes k and v into the
    paged cache, returns (q, k). q, k and v may be strided views of a fused qkv output (last dim
    contiguous). Neither positions nor slots are range-checked (no host sync)."""
    check_rotary(q, k, positions, cos_sin_cache)
    num_tokens, block_size, num_kv_heads, head_dim = check_cache_write(
        k, v, k_cache, v_cache, slot_mapping
    )
    num_heads = q.shape[1]
    if num_tokens == 0:
        return q, k
    check_launchable(q)
    half, BLOCK_HALF, BLOCK_H = rotary_tiles(head_dim, num_heads, num_kv_heads)
    _rotary_store_kv_kernel[(num_tokens,)](
        q,
        k,
        v,
        positions,
        cos_sin_cache,
        k_cache,
        v_cache,
        slot_mapping,
        float(k_scale),
        float(v_scale),
        num_heads,
        num_kv_heads,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        cos_sin_cache.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        HALF=half,
        BLOCK_HALF=BLOCK_HALF,
        BLOCK_H=BLOCK_H,
        BLOCK_SIZE=block_size,
        QUANTIZE=k_cache.dtype == FP8_DTYPE,
        ROUND_IN_FP32=interpreting(),
        num_warps=4,
    )
    return q, k
