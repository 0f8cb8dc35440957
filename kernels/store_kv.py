# Write new K/V rows into the paged cache through a slot mapping.
#   key, value:      [num_tokens, num_kv_heads, head_dim]
#   k_cache/v_cache: [num_blocks, block_size, num_kv_heads, head_dim]
#   slot_mapping:    [num_tokens] int64, slot = block_id * block_size + offset; slot < 0 = skip
# (padding tokens of a CUDA-graph batch carry slot -1).
# An FP8 (e4m3) cache stores clamp(K / k_scale) and clamp(V / v_scale), rounded to nearest even;
# the attention kernels multiply the scales back in.
import torch
import triton
import triton.language as tl

from kernels._launch import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    KV_CACHE_DTYPES,
    check_contiguous,
    check_last_dim_contiguous,
    check_launchable,
    check_shape,
    check_tensor,
    interpreting,
    next_power_of_2,
)
from kernels.fp8_quant import E4M3_MAX, FP8_DTYPE, round_to_e4m3


def to_cache_dtype(x: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """K or V rows as the cache stores them."""
    if dtype == FP8_DTYPE:
        return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)
    return x.to(dtype)


def store_kv_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    k_flat = k_cache.view(-1, *k_cache.shape[2:])
    v_flat = v_cache.view(-1, *v_cache.shape[2:])
    k_flat[slots] = to_cache_dtype(key[valid], k_cache.dtype, k_scale)
    v_flat[slots] = to_cache_dtype(value[valid], v_cache.dtype, v_scale)


# ---------------------------------------------------------------------------------------------
# Triton kernel. One program per (token, tile of KV heads): it reads the token's slot, splits it
# into (block id, offset in block) and copies a [BLOCK_H, BLOCK_D] tile of K and of V into the
# cache. A negative slot (CUDA-graph padding) makes the program return before touching memory.
# ---------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize_on_alignment=["slot_mapping_ptr"])
def _store_kv_kernel(
    key_ptr,  # [num_tokens, num_kv_heads, head_dim]
    value_ptr,  # [num_tokens, num_kv_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping_ptr,  # [num_tokens]
    k_scale,  # FP8 cache: stored = value / scale
    v_scale,
    num_kv_heads,
    head_dim,
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
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    BLOCK_H: tl.constexpr,  # KV heads per program
    BLOCK_D: tl.constexpr,  # head_dim rounded up to a power of two
    QUANTIZE: tl.constexpr,  # the cache is e4m3
    ROUND_IN_FP32: tl.constexpr,  # interpreter: see fp8_quant.round_to_e4m3
):
    tok = tl.program_id(0).to(tl.int64)
    pid_h = tl.program_id(1)

    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    if slot < 0:  # padding token: nothing to store
        return
    block_id = slot // BLOCK_SIZE
    block_off = slot % BLOCK_SIZE

    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H]
    offs_d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    mask = (offs_h[:, None] < num_kv_heads) & (offs_d[None, :] < head_dim)  # [BLOCK_H, BLOCK_D]

    # key[tok, h, d] and value[tok, h, d] (last dim contiguous)
    k_src = key_ptr + tok * stride_k_tok + offs_h[:, None] * stride_k_head + offs_d[None, :]
    v_src = value_ptr + tok * stride_v_tok + offs_h[:, None] * stride_v_head + offs_d[None, :]
    k = tl.load(k_src, mask=mask)
    v = tl.load(v_src, mask=mask)

    # k_cache[block_id, block_off, h, d]; block_id is int64 so large caches cannot overflow
    k_dst = (
        k_cache_ptr
        + block_id * stride_kc_block
        + block_off * stride_kc_slot
        + offs_h[:, None] * stride_kc_head
        + offs_d[None, :]
    )
    # v_cache[block_id, block_off, h, d]
    v_dst = (
        v_cache_ptr
        + block_id * stride_vc_block
        + block_off * stride_vc_slot
        + offs_h[:, None] * stride_vc_head
        + offs_d[None, :]
    )
    if QUANTIZE:
        k = round_to_e4m3(tl.clamp(k.to(tl.float32) / k_scale, -448.0, 448.0), ROUND_IN_FP32)
        v = round_to_e4m3(tl.clamp(v.to(tl.float32) / v_scale, -448.0, 448.0), ROUND_IN_FP32)
    # the store casts to the cache dtype (e.g. float32 activations into a bf16 cache)
    tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def check_cache_write(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> tuple[int, int, int, int]:
    """The arguments of a paged-cache write (store_kv's, rotary_store_kv's): key/value rows of
    the cache's head layout, one slot per row, caches alike. Returns (num_tokens, block_size,
    num_kv_heads, head_dim)."""
    check_tensor("k_cache", k_cache, ndim=4, dtypes=KV_CACHE_DTYPES)
    device = k_cache.device
    check_tensor("v_cache", v_cache, ndim=4, dtypes=KV_CACHE_DTYPES, device=device)
    check_tensor("key", key, ndim=3, dtypes=FLOAT_DTYPES, device=device)
    check_tensor("value", value, ndim=3, dtypes=FLOAT_DTYPES, device=device)
    check_tensor("slot_mapping", slot_mapping, ndim=1, dtypes=INDEX_DTYPES, device=device)
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    check_shape("v_cache", v_cache, tuple(k_cache.shape))
    if v_cache.dtype != k_cache.dtype:
        raise ValueError(f"k_cache and v_cache dtypes differ: {k_cache.dtype} vs {v_cache.dtype}")
    num_tokens = key.shape[0]
    check_shape("key", key, (num_tokens, num_kv_heads, head_dim))
    check_shape("value", value, (num_tokens, num_kv_heads, head_dim))
    check_shape("slot_mapping", slot_mapping, (num_tokens,))
    for name, t in (("key", key), ("value", value), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_last_dim_contiguous(name, t)
    check_contiguous("slot_mapping", slot_mapping)
    return num_tokens, block_size, num_kv_heads, head_dim


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Triton twin of `store_kv_ref`: writes key/value rows into the paged cache in place.

    key/value may be strided views (e.g. slices of a fused QKV output) as long as the last dim is
    contiguous. Slots are not range-checked (that would need a host sync): a slot >= num_blocks *
    block_size writes out of bounds, exactly like an out-of-range index on the GPU.
    """
    num_tokens, block_size, num_kv_heads, head_dim = check_cache_write(
        key, value, k_cache, v_cache, slot_mapping
    )
    if num_tokens == 0:
        return
    check_launchable(key)

    BLOCK_D = next_power_of_2(head_dim)
    # keep a program's tile at <= 4096 elements per tensor
    BLOCK_H = min(next_power_of_2(num_kv_heads), max(1, 4096 // BLOCK_D))
    grid = (num_tokens, triton.cdiv(num_kv_heads, BLOCK_H))
    _store_kv_kernel[grid](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        float(k_scale),
        float(v_scale),
        num_kv_heads,
        head_dim,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        BLOCK_SIZE=block_size,
        BLOCK_H=BLOCK_H,
        BLOCK_D=BLOCK_D,
        QUANTIZE=k_cache.dtype == FP8_DTYPE,
        ROUND_IN_FP32=interpreting(),
        num_warps=4 if BLOCK_H * BLOCK_D >= 1024 else 1,
    )
