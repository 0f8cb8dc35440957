# apply_rotary (Triton, neox layout, in place) against apply_rotary_ref.
# Tolerances: kernel_test_utils.TOL (fp32 rtol 1e-4 / atol 1e-5, bf16 rtol 1.6e-2 / atol 1e-2).
import pytest
import torch

from kernels.rotary import apply_rotary, apply_rotary_ref
from tests.kernels.kernel_test_utils import DEVICE, assert_close, gen, int_tensor, randn


def _cos_sin(max_pos: int, head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    freqs = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"), [(4, 4, 64), (8, 1, 128), (6, 2, 64)]
)
def test_rotary_matches_reference(dtype, num_heads, num_kv_heads, head_dim):
    g = gen(num_heads * head_dim)
    max_pos = 4096
    cos_sin = _cos_sin(max_pos, head_dim)
    positions = int_tensor([0, 1, 17, max_pos - 1, 4000, 2], torch.int64)
    q = randn(6, num_heads, head_dim, g=g, dtype=dtype)
    k = randn(6, num_kv_heads, head_dim, g=g, dtype=dtype)
    q_ref, k_ref = apply_rotary_ref(q.clone(), k.clone(), positions, cos_sin)
    q_out, k_out = apply_rotary(q, k, positions, cos_sin)
    assert q_out is q and k_out is k  # in place
    assert_close(q, q_ref, dtype)
    assert_close(k, k_ref, dtype)


def test_rotary_through_strided_qkv_views():
    # q and k as views of one fused qkv buffer: rotated in place without copies; v untouched
    g = gen(2)
    num_heads, num_kv_heads, head_dim, tokens = 4, 2, 64, 5
    qkv = randn(tokens, (num_heads + 2 * num_kv_heads) * head_dim, g=g)
    original = qkv.clone()
    q, k, v = qkv.split(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], -1
    )
    q = q.view(tokens, num_heads, head_dim)
    k = k.view(tokens, num_kv_heads, head_dim)
    positions = int_tensor([3, 9, 0, 100, 55], torch.int32)
    cos_sin = _cos_sin(128, head_dim)
    q_ref, k_ref = apply_rotary_ref(q.clone(), k.clone(), positions, cos_sin)
    apply_rotary(q, k, positions, cos_sin)
    assert_close(q, q_ref, torch.float32)
    assert_close(k, k_ref, torch.float32)
    assert torch.equal(v, original[:, (num_heads + num_kv_heads) * head_dim :])


def test_rotary_empty():
    q = torch.empty(0, 2, 64, device=DEVICE)
    k = torch.empty(0, 1, 64, device=DEVICE)
    apply_rotary(q, k, torch.empty(0, dtype=torch.int64, device=DEVICE), _cos_sin(8, 64))


@pytest.mark.parametrize(
    "case",
    ["cache_dim", "odd_head_dim", "positions_len", "positions_dtype", "k_head_dim", "q_ndim"],
)
def test_rotary_rejects_bad_inputs(case):
    g = gen(3)
    q = randn(4, 2, 64, g=g)
    k = randn(4, 1, 64, g=g)
    positions = int_tensor([0, 1, 2, 3], torch.int64)
    cos_sin = _cos_sin(16, 64)
    if case == "cache_dim":
        cos_sin = _cos_sin(16, 32)
    elif case == "odd_head_dim":
        q, k, cos_sin = randn(4, 2, 7, g=g), randn(4, 1, 7, g=g), torch.zeros(16, 7, device=DEVICE)
    elif case == "positions_len":
        positions = positions[:3]
    elif case == "positions_dtype":
        positions = positions.float()
    elif case == "k_head_dim":
        k = randn(4, 1, 32, g=g)
    elif case == "q_ndim":
        q = q.view(4, 128)
    with pytest.raises(ValueError):
        apply_rotary(q, k, positions, cos_sin)
