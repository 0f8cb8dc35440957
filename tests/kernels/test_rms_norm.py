# rms_norm (Triton, optionally fused with the residual add) against rms_norm_ref; rms_norm_fp8
# (the same with e4m3 output) against rms_norm + quantize_fp8 (bit for bit) and its torch twin.
# Tolerances: kernel_test_utils.TOL (fp32 rtol 1e-4 / atol 1e-5, bf16 rtol 1.6e-2 / atol 1e-2,
# fp16 rtol / atol 2e-3). Outputs are pre-filled with NaN to catch unwritten elements.
import pytest
import torch

from kernels.fp8_quant import E4M3_MAX, quantize_fp8
from kernels.rms_norm import rms_norm, rms_norm_fp8, rms_norm_fp8_ref, rms_norm_ref
from tests.kernels.kernel_test_utils import (
    DEVICE,
    assert_close,
    assert_fp8_rows_close,
    assert_same_fp8_rows,
    gen,
    nan_like,
    randn,
)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("hidden", [64, 300, 4096])
def test_rms_norm_matches_reference(dtype, hidden):
    g = gen(hidden)
    x = randn(7, hidden, g=g, dtype=dtype) * 3
    weight = (1 + 0.1 * randn(hidden, g=g)).to(dtype)
    out = nan_like(x)
    ret = rms_norm(x, weight, 1e-6, out=out)
    assert ret is out and not out.isnan().any()
    assert_close(out, rms_norm_ref(x, weight, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("hidden", [128, 1000])
def test_rms_norm_fused_residual(dtype, hidden):
    g = gen(2 * hidden)
    x = randn(5, hidden, g=g, dtype=dtype)
    residual = randn(5, hidden, g=g, dtype=dtype)
    weight = (1 + 0.1 * randn(hidden, g=g)).to(dtype)
    out, summed = rms_norm(x, weight, 1e-5, residual)
    ref_out, ref_summed = rms_norm_ref(x, weight, 1e-5, residual)
    assert out.dtype == dtype and summed.dtype == dtype
    assert_close(summed, ref_summed, dtype)
    assert_close(out, ref_out, dtype)


def test_rms_norm_in_place_buffers():
    # out may alias x and residual_out may alias residual (static CUDA-graph buffers)
    g = gen(3)
    x = randn(4, 256, g=g)
    residual = randn(4, 256, g=g)
    weight = randn(256, g=g)
    ref_out, ref_summed = rms_norm_ref(x.clone(), weight, 1e-6, residual.clone())
    out, summed = rms_norm(x, weight, 1e-6, residual, out=x, residual_out=residual)
    assert out is x and summed is residual
    assert_close(x, ref_out, torch.float32)
    assert_close(residual, ref_summed, torch.float32)


def test_rms_norm_strided_rows_3d_and_mixed_weight_dtype():
    g = gen(4)
    # a 2-D view with a row stride (slice of a wider buffer)
    buf = randn(6, 200, g=g, dtype=torch.bfloat16)
    x = buf[:, 50:178]
    weight = randn(128, g=g, dtype=torch.bfloat16)
    assert_close(rms_norm(x, weight, 1e-6), rms_norm_ref(x, weight, 1e-6), torch.bfloat16)
    # per-head normalisation of [tokens, heads, head_dim] (Qwen3 qk-norm)
    x3 = randn(3, 4, 64, g=g)
    w3 = randn(64, g=g)
    assert_close(rms_norm(x3, w3, 1e-6), rms_norm_ref(x3, w3, 1e-6), torch.float32)
    # float32 weight with bf16 activations promotes like the reference does
    xb = randn(3, 64, g=g, dtype=torch.bfloat16)
    out = rms_norm(xb, w3, 1e-6)
    ref = rms_norm_ref(xb, w3, 1e-6)
    assert out.dtype == ref.dtype == torch.float32
    assert_close(out, ref, torch.bfloat16)


def test_rms_norm_empty():
    x = torch.empty(0, 64, device=DEVICE)
    assert rms_norm(x, torch.ones(64, device=DEVICE), 1e-6).shape == (0, 64)


@pytest.mark.parametrize(
    "case", ["weight_len", "weight_ndim", "residual_shape", "residual_dtype", "out_shape", "x_int"]
)
def test_rms_norm_rejects_bad_inputs(case):
    g = gen(5)
    x = randn(4, 64, g=g)
    weight = randn(64, g=g)
    residual, kw = None, {}
    if case == "weight_len":
        weight = weight[:32]
    elif case == "weight_ndim":
        weight = weight.view(8, 8)
    elif case == "residual_shape":
        residual = randn(4, 32, g=g)
    elif case == "residual_dtype":
        residual = randn(4, 64, g=g).half()
    elif case == "out_shape":
        kw["out"] = torch.empty(4, 32, device=DEVICE)
    elif case == "x_int":
        x = x.int()
    with pytest.raises(ValueError):
        rms_norm(x, weight, 1e-6, residual, **kw)


# -- rms_norm_fp8: e4m3 output with per-row scales, for an FP8 linear layer ------------------


def _norm_inputs(rows: int, hidden: int, dtype: torch.dtype, seed: int):
    g = gen(seed)
    # rows five decades apart, so each row's scale differs
    x = randn(rows, hidden, g=g) * torch.logspace(-2, 3, rows, device=DEVICE)[:, None]
    residual = randn(rows, hidden, g=g) * 5
    weight = 1 + 0.5 * randn(hidden, g=g)
    weight[7] = 40.0  # one large weight: an outlier column in every row
    return x.to(dtype), residual.to(dtype), weight.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("hidden", [64, 300])
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_rms_norm_fp8_is_rms_norm_then_quantize_fp8(dtype, hidden, with_residual):
    x, residual, weight = _norm_inputs(5, hidden, dtype, seed=hidden)
    res = residual if with_residual else None
    got = rms_norm_fp8(x, weight, 1e-5, res)
    two_kernels = rms_norm(x, weight, 1e-5, res)
    normed = two_kernels[0] if with_residual else two_kernels
    assert_same_fp8_rows(got[:2], quantize_fp8(normed))  # the same bits as the unfused path
    if with_residual:
        assert torch.equal(got[2], two_kernels[1])
    # and the torch twin of the composition, within rms_norm's own tolerance
    want = rms_norm_fp8_ref(x, weight, 1e-5, res)
    assert_fp8_rows_close(got[:2], want[:2], dtype)
    if with_residual:
        assert_close(got[2], want[2], dtype)


def test_rms_norm_fp8_static_scale_and_scale_cap():
    x, residual, weight = _norm_inputs(4, 128, torch.bfloat16, seed=9)
    normed, _ = rms_norm(x, weight, 1e-6, residual)
    for kw in ({"scale_ub": 3.0}, {"input_scale": torch.tensor([0.02], device=DEVICE)}):
        got = rms_norm_fp8(x, weight, 1e-6, residual, **kw)
        assert_same_fp8_rows(
            got[:2], quantize_fp8(normed, kw.get("input_scale"), kw.get("scale_ub", 0.0))
        )
    capped = rms_norm_fp8(x, weight, 1e-6, residual, scale_ub=3.0)
    # Within a few float32 ulps of 3 / 448: Triton's float32 division on the GPU is the fast
    # one (up to 2 ulps; on the H200 the capped scale came out above the rounded quotient)
    assert (capped[1] <= 3.0 / E4M3_MAX * (1 + 1e-6)).all()
    assert (capped[1] >= 3.0 / E4M3_MAX * (1 - 1e-6)).all()  # ... and the cap did apply
    assert capped[0].float().abs().max().item() == E4M3_MAX  # the outlier column saturates


def test_rms_norm_fp8_rejects_bad_inputs():
    x, _, weight = _norm_inputs(2, 64, torch.bfloat16, seed=1)
    with pytest.raises(ValueError):
        rms_norm_fp8(x, weight.float(), 1e-6)  # the unfused output's dtype would be float32
    with pytest.raises(ValueError):
        rms_norm_fp8(x, weight, 1e-6, input_scale=torch.ones(2, device=DEVICE))
    with pytest.raises(ValueError):
        rms_norm_fp8(x, weight, 1e-6, out=torch.empty(2, 64, device=DEVICE))  # not e4m3
