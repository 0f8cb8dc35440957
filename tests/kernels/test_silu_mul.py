# silu_and_mul (Triton) against silu_and_mul_ref.
# Tolerances: kernel_test_utils.TOL (fp32 rtol 1e-4 / atol 1e-5, bf16 rtol 1.6e-2 / atol 1e-2,
# fp16 rtol / atol 2e-3). Outputs are pre-filled with NaN to catch unwritten elements.
import pytest
import torch

from kernels.silu_mul import silu_and_mul, silu_and_mul_ref
from tests.kernels.kernel_test_utils import DEVICE, assert_close, gen, nan_like, randn


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
