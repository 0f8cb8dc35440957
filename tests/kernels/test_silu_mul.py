# silu_and_mul (Triton) against silu_and_mul_ref; silu_and_mul_fp8 (the same with e4m3 output)
# against silu_and_mul + quantize_fp8 (bit for bit) and its torch twin.
# Tolerances: kernel_test_utils.TOL (fp32 rtol 1e-4 / atol 1e-5, bf16 rtol 1.6e-2 / atol 1e-2,
# fp16 rtol / atol 2e-3). Outputs are pre-filled with NaN to catch unwritten elements.
import pytest
import torch

from kernels.fp8_quant import E4M3_MAX, MIN_SCALE, quantize_fp8
from kernels.silu_mul import silu_and_mul, silu_and_mul_fp8, silu_and_mul_fp8_ref, silu_and_mul_ref
from tests.kernels.kernel_test_utils import (
    DEVICE,
    assert_close,
    assert_fp8_rows_close,
    assert_same_fp8_rows,
    gen,
    nan_like,
    randn,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("inter", [1, 100, 1500])  # 1500: two column tiles, the last partial
def test_silu_and_mul_matches_reference(dtype, inter):
    g = gen(inter)
    x = randn(6, 2 * inter, g=g, dtype=dtype) * 4  # reaches the saturated tails of silu
    out = nan_like(x[:, :inter])
    ret = silu_and_mul(x, out=out)
    assert ret is out and not out.isnan().any()
    assert_close(out, silu_and_mul_ref(x), dtype)


def test_silu_and_mul_3d_strided_and_default_out():
    g = gen(2)
    x3 = randn(2, 3, 64, g=g)
    out3 = silu_and_mul(x3)
    assert out3.shape == (2, 3, 32)
    assert_close(out3, silu_and_mul_ref(x3), torch.float32)
    buf = randn(4, 300, g=g, dtype=torch.bfloat16)
    x = buf[:, 10:266]  # row stride 300
    assert_close(silu_and_mul(x), silu_and_mul_ref(x), torch.bfloat16)


def test_silu_and_mul_extreme_values():
    x = torch.tensor([[-1e4, 1e4, -30.0, 0.0, 2.0, -3.0, 5.0, 1.0]], device=DEVICE)
    assert_close(silu_and_mul(x), silu_and_mul_ref(x), torch.float32)


def test_silu_and_mul_empty():
    assert silu_and_mul(torch.empty(0, 8, device=DEVICE)).shape == (0, 4)


@pytest.mark.parametrize("case", ["odd_last_dim", "out_shape", "out_dtype", "int_input"])
def test_silu_and_mul_rejects_bad_inputs(case):
    g = gen(3)
    x = randn(4, 64, g=g)
    kw = {}
    if case == "odd_last_dim":
        x = randn(4, 63, g=g)
    elif case == "out_shape":
        kw["out"] = torch.empty(4, 64, device=DEVICE)
    elif case == "out_dtype":
        kw["out"] = torch.empty(4, 32, device=DEVICE, dtype=torch.float16)
    elif case == "int_input":
        x = x.int()
    with pytest.raises(ValueError):
        silu_and_mul(x, **kw)


# -- silu_and_mul_fp8: e4m3 output with per-row scales, for an FP8 down projection -----------


def _gate_up(rows: int, inter: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = gen(seed)
    # rows 2.5 decades apart (each its own scale; products stay finite in fp16), one all-zero row
    x = randn(rows, 2 * inter, g=g) * torch.logspace(-1, 1.5, rows, device=DEVICE)[:, None]
    x[1] = 0.0
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("inter", [100, 2500])  # 2500: two passes of two column tiles each
def test_silu_and_mul_fp8_is_silu_and_mul_then_quantize_fp8(dtype, inter):
    x = _gate_up(4, inter, dtype, seed=inter)
    got = silu_and_mul_fp8(x)
    assert_same_fp8_rows(got, quantize_fp8(silu_and_mul(x)))  # the unfused path's bits
    assert got[1][1].item() == pytest.approx(MIN_SCALE) and not got[0][1].float().any()
    assert_fp8_rows_close(got, silu_and_mul_fp8_ref(x), dtype)  # the torch twin


def test_silu_and_mul_fp8_static_scale_cap_and_strided_rows():
    buf = _gate_up(3, 200, torch.bfloat16, seed=7)
    x = buf[:, :256]  # row stride 400: gate and up are the first 128 columns each
    product = silu_and_mul(x)
    static = torch.tensor([0.05], device=DEVICE)
    assert_same_fp8_rows(silu_and_mul_fp8(x, static), quantize_fp8(product, static))
    capped = silu_and_mul_fp8(x, scale_ub=1.0)
    assert_same_fp8_rows(capped, quantize_fp8(product, scale_ub=1.0))
    assert (capped[1] <= 1.0 / E4M3_MAX).all()


def test_silu_and_mul_fp8_rejects_bad_inputs():
    x = _gate_up(2, 32, torch.float32, seed=3)
    with pytest.raises(ValueError):
        silu_and_mul_fp8(x[:, :63])  # odd last dim
    with pytest.raises(ValueError):
        silu_and_mul_fp8(x, torch.ones(2, device=DEVICE))  # a static scale has one element
    with pytest.raises(ValueError):
        silu_and_mul_fp8(x, out=torch.empty(2, 32, device=DEVICE))  # not e4m3
