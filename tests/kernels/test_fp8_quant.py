# quantize_fp8 (Triton, per-token e4m3 activations) against quantize_fp8_ref: the same e4m3 bits
# and scales (the interpreter rounds through round_to_e4m3, a GPU converts in hardware, both to
# nearest even), and the dequantized values within e4m3's half-step of the input.
import pytest
import torch

from kernels.fp8_quant import E4M3_MAX, FP8_DTYPE, quantize_fp8, quantize_fp8_ref
from tests.kernels.kernel_test_utils import DEVICE, assert_same_e4m3, gen, randn


def _rows(num_rows: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    # rows spanning five decades of magnitude, one all-zero row, one outlier token
    g = gen(seed)
    x = randn(num_rows, k, g=g) * torch.logspace(-3, 2, num_rows, device=DEVICE)[:, None]
    x[1] = 0.0
    x[-1, 3] = 3000.0
    return x.to(dtype)


def _assert_same(actual, expected):
    q, scale = actual
    q_ref, scale_ref = expected
    assert q.dtype == FP8_DTYPE and scale.shape == (q.shape[0], 1)
    assert_same_e4m3(q, q_ref)
    torch.testing.assert_close(scale, scale_ref, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k", [64, 300, 4100])  # one tile, a ragged tile, several tiles
def test_dynamic_per_token_matches_reference(dtype, k):
    x = _rows(6, k, dtype, seed=k)
    _assert_same(quantize_fp8(x), quantize_fp8_ref(x))


def test_scale_upper_bound_and_static_scale_match_reference():
    x = _rows(5, 256, torch.bfloat16, seed=3)
    _assert_same(quantize_fp8(x, scale_ub=20.0), quantize_fp8_ref(x, scale_ub=20.0))
    # the outlier row saturates at ±448 instead of flattening the rest of its row
    q, scale = quantize_fp8(x, scale_ub=20.0)
    assert scale[-1].item() == pytest.approx(20.0 / E4M3_MAX)
    assert q[-1].float().abs().max().item() == E4M3_MAX
    static = torch.tensor([0.01], device=DEVICE)
    _assert_same(quantize_fp8(x, static), quantize_fp8_ref(x, static))


def test_dequantized_within_half_a_step():
    # e4m3 keeps 3 mantissa bits: round to nearest is within 2^-4 of |x| for normal values;
    # values below the smallest normal (2^-6 · scale) are within half the subnormal step 2^-10.
    x = _rows(8, 512, torch.float32, seed=5)
    q, scale = quantize_fp8(x)
    err = (q.float() * scale - x).abs()
    bound = torch.maximum(x.abs() * 2**-4, scale * 2**-10) * (1 + 1e-6)
    assert (err <= bound).all()
    assert err.max() > 0  # something was actually rounded


def test_rejects_bad_inputs():
    x = _rows(2, 64, torch.float32, seed=1)
    with pytest.raises(ValueError):
        quantize_fp8(x[:, ::2])  # last dim not contiguous
    with pytest.raises(ValueError):
        quantize_fp8(x, torch.ones(2, device=DEVICE))  # a static scale has one element
    with pytest.raises(ValueError):
        quantize_fp8(x.view(2, 8, 8))
