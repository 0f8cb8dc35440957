# The FP8 (e4m3) KV cache: store_kv writes clamp(K / k_scale) rounded to nearest even, the decode
# and prefill kernels read it back times the scales. Each Triton kernel against its torch twin
# on the same e4m3 cache (stores bit for bit, attention within the usual tolerances), and the
# end-to-end error of attention over an FP8 cache against the same cache in float32.
import pytest
import torch

from kernels import paged_decode_attention as pda
from kernels.fp8_quant import FP8_DTYPE
from kernels.paged_decode_attention import paged_decode_attention, paged_decode_attention_ref
from kernels.paged_prefill_attention import paged_prefill_attention, paged_prefill_attention_ref
from kernels.store_kv import store_kv, store_kv_ref, to_cache_dtype
from tests.kernels.kernel_test_utils import (
    K_SCALE,
    V_SCALE,
    assert_close,
    assert_same_e4m3,
    fp8_kv,
    gen,
    int_tensor,
    nan_like,
    paged_kv,
    randn,
)


def _fp8_cache(seq_lens, *, num_kv_heads, head_dim, block_size, g):
    k, v, tables = paged_kv(
        seq_lens, num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size,
        dtype=torch.float32, g=g,
    )  # fmt: skip
    return *fp8_kv(k, v), tables


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_kv_quantizes_like_the_reference(dtype):
    g = gen(31)
    shape = (5, 16, 2, 64)
    k_cache = torch.zeros(shape, dtype=FP8_DTYPE, device=randn(1, g=g).device)
    v_cache = torch.zeros_like(k_cache)
    # magnitudes from subnormal to past the e4m3 range (saturates at ±448 · scale)
    key = randn(7, 2, 64, g=g) * torch.logspace(-4, 3, 7)[:, None, None].to(k_cache.device)
    value = randn(7, 2, 64, g=g) * 40
    slots = int_tensor([3, -1, 16, 79, 0, 40, 17], torch.int64)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    store_kv_ref(key.to(dtype), value.to(dtype), k_ref, v_ref, slots, K_SCALE, V_SCALE)
    store_kv(key.to(dtype), value.to(dtype), k_cache, v_cache, slots, K_SCALE, V_SCALE)
    assert_same_e4m3(k_cache, k_ref)
    assert_same_e4m3(v_cache, v_ref)
    assert k_cache.float().abs().max().item() == 448.0  # saturated, not NaN
    assert not k_cache.float().isnan().any()


@pytest.mark.parametrize(
    ("dtype", "num_heads", "num_kv_heads", "seq_lens", "num_splits"),
    [
        (torch.float32, 8, 2, [1, 17, 100, 0], 1),
        (torch.float32, 4, 1, [64, 5, 129], 3),
        (torch.bfloat16, 8, 2, [31, 90, 1], 2),
    ],
)
def test_decode_reads_fp8_cache_like_the_reference(
    dtype, num_heads, num_kv_heads, seq_lens, num_splits
):
    g = gen(41 + num_splits)
    k_cache, v_cache, tables = _fp8_cache(
        seq_lens, num_kv_heads=num_kv_heads, head_dim=64, block_size=16, g=g
    )
    q = randn(len(seq_lens), num_heads, 64, g=g, dtype=dtype)
    lens = int_tensor(seq_lens)
    out = paged_decode_attention(
        q, k_cache, v_cache, tables, lens, 0.125, max_seq_len=max(seq_lens),
        num_splits=num_splits, out=nan_like(q), k_scale=K_SCALE, v_scale=V_SCALE,
    )  # fmt: skip
    ref = paged_decode_attention_ref(
        q, k_cache, v_cache, tables, lens, 0.125, k_scale=K_SCALE, v_scale=V_SCALE
    )
    assert_close(out, ref, dtype)


@pytest.mark.parametrize(
    ("launch", "widen"),
    [(None, "q"), ((128, 4, 2), "fp16"), ((32, 8, 4), "fp16"), ((128, 4, 2), "q")],
)
def test_decode_fp8_launch_choice_keeps_the_result(launch, widen, monkeypatch):
    # The e4m3 cache's own (keys per tile, warps, stages) and widening, as decode_fp8_sweep.py
    # tries them: the tile changes how a split's range is rounded, the widening how e4m3 becomes
    # a dot operand (in q's dtype or in fp16, q with it), never the result.
    monkeypatch.setattr(pda, "FP8_LAUNCH", launch)
    monkeypatch.setattr(pda, "FP8_WIDEN", widen)
    g = gen(57)
    seq_lens = [1, 200, 77, 129]
    k_cache, v_cache, tables = _fp8_cache(seq_lens, num_kv_heads=2, head_dim=64, block_size=16, g=g)
    q = randn(len(seq_lens), 8, 64, g=g, dtype=torch.bfloat16)
    lens = int_tensor(seq_lens)
    ref = paged_decode_attention_ref(
        q, k_cache, v_cache, tables, lens, 0.125, k_scale=K_SCALE, v_scale=V_SCALE
    )
    for splits in (1, 3):
        out = paged_decode_attention(
            q, k_cache, v_cache, tables, lens, 0.125, max_seq_len=max(seq_lens),
            num_splits=splits, out=nan_like(q), k_scale=K_SCALE, v_scale=V_SCALE,
        )  # fmt: skip
        assert_close(out, ref, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_reads_fp8_cache_like_the_reference(dtype):
    g = gen(51)
    # chunks of 5, 16, 33 and 1 query tokens (a decode row) over cached prefixes
    seq_lens = [37, 16, 64, 9]
    k_cache, v_cache, tables = _fp8_cache(seq_lens, num_kv_heads=2, head_dim=64, block_size=16, g=g)
    qsl = int_tensor([0, 5, 21, 54, 55])
    q = randn(55, 8, 64, g=g, dtype=dtype)
    lens = int_tensor(seq_lens)
    out = paged_prefill_attention(
        q, k_cache, v_cache, tables, lens, qsl, 33, 0.125, out=nan_like(q),
        k_scale=K_SCALE, v_scale=V_SCALE,
    )  # fmt: skip
    ref = paged_prefill_attention_ref(
        q, k_cache, v_cache, tables, lens, qsl, 33, 0.125, k_scale=K_SCALE, v_scale=V_SCALE
    )
    assert_close(out, ref, dtype)


def test_attention_over_fp8_cache_stays_close_to_float32():
    # The same keys and values stored in a float32 and in an e4m3 cache: decode outputs agree
    # to a few percent (e4m3 keeps 3 mantissa bits), with scales that keep values in range.
    g = gen(61)
    seq_lens = [40, 200]
    k32, v32, tables = paged_kv(
        seq_lens, num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.float32, g=g
    )
    k8, v8 = to_cache_dtype(k32, FP8_DTYPE, 0.05), to_cache_dtype(v32, FP8_DTYPE, 0.05)
    q = randn(2, 4, 64, g=g)
    lens = int_tensor(seq_lens)
    exact = paged_decode_attention(q, k32, v32, tables, lens, 0.125, max_seq_len=200)
    approx = paged_decode_attention(
        q, k8, v8, tables, lens, 0.125, max_seq_len=200, k_scale=0.05, v_scale=0.05
    )
    rel = (approx - exact).norm() / exact.norm()
    assert 0 < rel < 0.05


def test_a_float_cache_ignores_the_scales():
    # Scales describe how an e4m3 cache stores K and V; a bf16/fp32 cache holds them as they are.
    g = gen(71)
    k, v, tables = paged_kv([33, 5], num_kv_heads=2, head_dim=64, block_size=16,
                            dtype=torch.float32, g=g)  # fmt: skip
    q = randn(2, 4, 64, g=g)
    lens = int_tensor([33, 5])
    plain = paged_decode_attention(q, k, v, tables, lens, 0.125, max_seq_len=33)
    scaled = paged_decode_attention(
        q, k, v, tables, lens, 0.125, max_seq_len=33, k_scale=K_SCALE, v_scale=V_SCALE
    )
    assert torch.equal(plain, scaled)
    ref = paged_decode_attention_ref(q, k, v, tables, lens, 0.125, k_scale=K_SCALE, v_scale=V_SCALE)
    assert_close(scaled, ref, torch.float32)
