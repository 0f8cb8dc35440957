# rotary_store_kv (Triton: rotary and the paged cache write in one pass) against its reference,
# apply_rotary_ref then store_kv_ref. q and k are compared with kernel_test_utils.TOL; the cache
# must hold exactly the rotated k the kernel left in k (bit for bit for a cache of k's dtype).
import pytest
import torch

from kernels.fp8_quant import FP8_DTYPE
from kernels.rotary_store_kv import rotary_store_kv, rotary_store_kv_ref
from kernels.store_kv import to_cache_dtype
from tests.kernels.kernel_test_utils import (
    DEVICE,
    assert_close,
    assert_same_e4m3,
    gen,
    int_tensor,
    randn,
)


def _cos_sin(max_pos: int, head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    freqs = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(DEVICE)


def _qkv_views(tokens, num_heads, num_kv_heads, head_dim, dtype, g):
    """q, k, v as strided views of one fused qkv buffer, as the model hands them over."""
    qkv = randn(tokens, (num_heads + 2 * num_kv_heads) * head_dim, g=g, dtype=dtype)
    q, k, v = qkv.split(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], -1
    )
    return (
        q.view(tokens, num_heads, head_dim),
        k.view(tokens, num_kv_heads, head_dim),
        v.view(tokens, num_kv_heads, head_dim),
    )


def _slot_of(cache: torch.Tensor, slot: int) -> torch.Tensor:
    return cache.view(-1, *cache.shape[2:])[slot]


@pytest.mark.parametrize(
    ("dtype", "num_heads", "num_kv_heads", "head_dim", "block_size"),
    [
        (torch.float32, 4, 4, 64, 16),
        (torch.float32, 8, 1, 128, 8),
        (torch.bfloat16, 8, 2, 128, 16),
        (torch.float16, 6, 3, 64, 32),  # a KV head count that is not a power of two
    ],
)
def test_rotary_store_kv_matches_reference(dtype, num_heads, num_kv_heads, head_dim, block_size):
    g = gen(num_heads * head_dim + block_size)
    num_blocks = 6
    last = num_blocks * block_size - 1
    # block boundaries, the last slot, padding (-1), slots out of order
    slots = [block_size - 1, -1, 0, block_size, 3 * block_size + 5, last, -1]
    positions = int_tensor([0, 1, 17, 4095, 4000, 2, 9], torch.int64)
    cos_sin = _cos_sin(4096, head_dim)
    q, k, v = _qkv_views(len(slots), num_heads, num_kv_heads, head_dim, dtype, g)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = randn(*shape, g=g, dtype=dtype), randn(*shape, g=g, dtype=dtype)
    q_ref, k_ref, v_ref = q.clone(), k.clone(), v.clone()
    kc_ref, vc_ref = k_cache.clone(), v_cache.clone()
    slot_mapping = int_tensor(slots, torch.int64)
    rotary_store_kv_ref(q_ref, k_ref, v_ref, positions, cos_sin, kc_ref, vc_ref, slot_mapping)
    v_before = v.clone()
    q_out, k_out = rotary_store_kv(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping)
    assert q_out is q and k_out is k  # in place
    assert_close(q, q_ref, dtype)
    assert_close(k, k_ref, dtype)
    assert torch.equal(v, v_before)  # v is read, never written
    for i, slot in enumerate(slots):
        if slot >= 0:  # the cache holds the kernel's own rotated k, and v as given
            assert torch.equal(_slot_of(k_cache, slot), k[i])
            assert torch.equal(_slot_of(v_cache, slot), v[i])
    # every slot nobody wrote is untouched
    untouched = torch.ones(num_blocks * block_size, dtype=torch.bool)
    untouched[[s for s in slots if s >= 0]] = False
    assert torch.equal(k_cache.view(-1, num_kv_heads, head_dim)[untouched.to(DEVICE)],
                       kc_ref.view(-1, num_kv_heads, head_dim)[untouched.to(DEVICE)])  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_store_kv_quantizes_an_e4m3_cache(dtype):
    g = gen(41)
    k_scale, v_scale = 0.25, 0.5
    q, k, v = _qkv_views(5, 8, 2, 64, dtype, g)
    k.mul_(50)  # past the e4m3 range once divided by the scale: saturates at 448
    shape = (4, 16, 2, 64)
    k_cache = torch.zeros(shape, dtype=FP8_DTYPE, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    slots = int_tensor([3, -1, 16, 63, 0], torch.int64)
    positions = int_tensor([5, 6, 100, 7, 0], torch.int32)
    cos_sin = _cos_sin(128, 64)
    k_ref, v_ref = k.clone(), v.clone()
    kc_ref, vc_ref = k_cache.clone(), v_cache.clone()
    rotary_store_kv_ref(q.clone(), k_ref, v_ref, positions, cos_sin, kc_ref, vc_ref, slots,
                        k_scale, v_scale)  # fmt: skip
    rotary_store_kv(q, k, v, positions, cos_sin, k_cache, v_cache, slots, k_scale, v_scale)
    # From the k the kernel rotated (the interpreter's bf16 rounding may differ by an ulp):
    # exactly what store_kv would have written.
    want = to_cache_dtype(k[[0, 2, 3, 4]], FP8_DTYPE, k_scale)
    got = k_cache.view(-1, 2, 64)[[3, 16, 63, 0]]
    assert_same_e4m3(got, want)
    assert_same_e4m3(v_cache, vc_ref)
    assert k_cache.float().abs().max().item() == 448.0
    assert not k_cache.float().isnan().any()


def test_rotary_store_kv_empty_and_bad_input():
    q = torch.empty(0, 2, 64, device=DEVICE)
    k = torch.empty(0, 1, 64, device=DEVICE)
    cache = torch.zeros(2, 16, 1, 64, device=DEVICE)
    empty = torch.empty(0, dtype=torch.int64, device=DEVICE)
    rotary_store_kv(q, k, k, empty, _cos_sin(8, 64), cache, cache.clone(), empty)
    k3 = torch.zeros(3, 1, 64, device=DEVICE)
    with pytest.raises(ValueError, match="q must be"):
        rotary_store_kv(k3[0], k3, k3, empty, _cos_sin(8, 64), cache, cache.clone(), empty)
    with pytest.raises(ValueError, match="cos_sin_cache"):
        q3 = torch.zeros(3, 2, 64, device=DEVICE)
        pos = int_tensor([0, 1, 2], torch.int64)
        rotary_store_kv(q3, k3, k3, pos, _cos_sin(8, 32), cache, cache.clone(), pos)
