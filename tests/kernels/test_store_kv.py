# store_kv (Triton) against store_kv_ref. Same-dtype stores are plain copies, so the caches must
# match bit for bit; a float32 -> bf16 store uses the bf16 tolerance (see kernel_test_utils.TOL).
import pytest
import torch

from kernels.store_kv import store_kv, store_kv_ref
from tests.kernels.kernel_test_utils import TOL, gen, int_tensor, randn


def _caches(num_blocks, block_size, num_kv_heads, head_dim, dtype, g):
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return randn(*shape, g=g, dtype=dtype), randn(*shape, g=g, dtype=dtype)


@pytest.mark.parametrize(
    ("dtype", "num_kv_heads", "head_dim", "block_size"),
    [
        (torch.float32, 2, 64, 16),
        (torch.float32, 3, 128, 8),  # non power-of-two head count
        (torch.bfloat16, 8, 128, 16),
        (torch.float16, 1, 64, 32),
        (torch.float32, 2, 80, 16),  # non power-of-two head_dim is fine for a copy
    ],
)
def test_store_kv_matches_reference(dtype, num_kv_heads, head_dim, block_size):
    g = gen(1000 + num_kv_heads * head_dim + block_size)
    num_blocks = 6
    k_cache, v_cache = _caches(num_blocks, block_size, num_kv_heads, head_dim, dtype, g)
    last = num_blocks * block_size - 1
    # block boundaries (first/last slot of a block, first slot of the next), the very last slot,
    # and padding tokens (-1) in between; slots out of order
    slots = [block_size - 1, -1, 0, block_size, 3 * block_size + 5, last, -1, 2 * block_size]
    key = randn(len(slots), num_kv_heads, head_dim, g=g, dtype=dtype)
    value = randn(len(slots), num_kv_heads, head_dim, g=g, dtype=dtype)
    slot_mapping = int_tensor(slots, torch.int64)

    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    store_kv_ref(key, value, k_ref, v_ref, slot_mapping)
    store_kv(key, value, k_cache, v_cache, slot_mapping)
    assert torch.equal(k_cache, k_ref)
    assert torch.equal(v_cache, v_ref)


def test_store_kv_strided_views_and_int32_slots():
    # key/value as views of a fused qkv projection: [tokens, (H + 2 Hkv) * D] → row stride != H*D
    g = gen(7)
    num_tokens, num_heads, num_kv_heads, head_dim, block_size = 5, 4, 2, 64, 16
    qkv = randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, g=g)
    _, k, v = qkv.split(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], -1
    )
    key = k.view(num_tokens, num_kv_heads, head_dim)
    value = v.view(num_tokens, num_kv_heads, head_dim)
    assert not key.is_contiguous()
    k_cache, v_cache = _caches(4, block_size, num_kv_heads, head_dim, torch.float32, g)
    slot_mapping = int_tensor([17, 16, -1, 63, 0], torch.int32)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    store_kv_ref(key, value, k_ref, v_ref, slot_mapping)
    store_kv(key, value, k_cache, v_cache, slot_mapping)
    assert torch.equal(k_cache, k_ref)
    assert torch.equal(v_cache, v_ref)


def test_store_kv_casts_to_cache_dtype():
    g = gen(8)
    k_cache, v_cache = _caches(3, 16, 2, 64, torch.bfloat16, g)
    key = randn(4, 2, 64, g=g)  # float32 activations into a bf16 cache
    value = randn(4, 2, 64, g=g)
    slot_mapping = int_tensor([5, 40, -1, 16], torch.int64)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    store_kv_ref(key, value, k_ref, v_ref, slot_mapping)
    store_kv(key, value, k_cache, v_cache, slot_mapping)
    torch.testing.assert_close(k_cache.float(), k_ref.float(), **TOL[torch.bfloat16])
    torch.testing.assert_close(v_cache.float(), v_ref.float(), **TOL[torch.bfloat16])


def test_store_kv_all_padding_and_empty():
    g = gen(9)
    k_cache, v_cache = _caches(2, 16, 2, 64, torch.float32, g)
    k0, v0 = k_cache.clone(), v_cache.clone()
    key = randn(3, 2, 64, g=g)
    store_kv(key, key, k_cache, v_cache, int_tensor([-1, -1, -1], torch.int64))
    empty = key[:0]
    store_kv(empty, empty, k_cache, v_cache, int_tensor([], torch.int64))
    assert torch.equal(k_cache, k0)
    assert torch.equal(v_cache, v0)


def _bad_store_args(case):
    g = gen(10)
    k_cache, v_cache = _caches(2, 16, 2, 64, torch.float32, g)
    key = randn(3, 2, 64, g=g)
    value = randn(3, 2, 64, g=g)
    slots = int_tensor([0, 1, 2], torch.int64)
    if case == "key_ndim":
        key = key.view(3, 128)
    elif case == "key_heads":
        key = randn(3, 4, 64, g=g)
    elif case == "value_tokens":
        value = value[:2]
    elif case == "slot_len":
        slots = slots[:2]
    elif case == "slot_dtype":
        slots = slots.float()
    elif case == "cache_shapes":
        v_cache = v_cache[:1]
    elif case == "cache_dtypes":
        v_cache = v_cache.half()
    elif case == "key_last_dim_stride":
        key = randn(3, 2, 128, g=g)[..., ::2]
    return key, value, k_cache, v_cache, slots


@pytest.mark.parametrize(
    "case",
    [
        "key_ndim",
        "key_heads",
        "value_tokens",
        "slot_len",
        "slot_dtype",
        "cache_shapes",
        "cache_dtypes",
        "key_last_dim_stride",
    ],
)
def test_store_kv_rejects_bad_inputs(case):
    with pytest.raises(ValueError):
        store_kv(*_bad_store_args(case))
