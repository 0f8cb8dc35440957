# rms_norm (Triton, optionally fused with the residual add) against rms_norm_ref.
# Tolerances: kernel_test_utils.TOL (fp32 rtol 1e-4 / atol 1e-5, bf16 rtol 1.6e-2 / atol 1e-2,
# fp16 rtol / atol 2e-3). Outputs are pre-filled with NaN to catch unwritten elements.
import pytest
import torch

from kernels.rms_norm import rms_norm, rms_norm_ref
from tests.kernels.kernel_test_utils import DEVICE, assert_close, gen, nan_like, randn

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
