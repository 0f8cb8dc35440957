# Shared helpers for the kernel tests: device choice, tolerances, paged-cache builders.
import pytest
import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ON_GPU = DEVICE.type == "cuda"

# Tolerances for torch.testing.assert_close(actual=triton, expected=torch reference):
#   float32:  rtol 1e-4, atol 1e-5. Statistics and dots are float32 (tl.dot with
#             input_precision="ieee", no TF32); observed errors are ~1e-6.
#   float16:  rtol 2e-3, atol 2e-3 (~2 fp16 ulps; on a GPU the attention P matrix is rounded to
#             fp16 before the P @ V dot, as in every flash-attention kernel).
#   bfloat16: rtol 1.6e-2 (2 bf16 ulps), atol 1e-2. On a GPU the P matrix is rounded to bf16
#             before P @ V. Under TRITON_INTERPRET the interpreter's float32 -> bf16 cast
#             truncates instead of rounding to nearest even, so outputs can be 1 ulp off the
#             reference (which itself rounds twice in rms_norm / silu_and_mul).
TOL = {
    torch.float32: {"rtol": 1e-4, "atol": 1e-5},
    torch.float16: {"rtol": 2e-3, "atol": 2e-3},
    torch.bfloat16: {"rtol": 1.6e-2, "atol": 1e-2},
}

requires_gpu = pytest.mark.skipif(
    not ON_GPU, reason="needs a CUDA GPU (real bf16 tl.dot / CUDA graphs; the CPU interpreter "
    "runs bf16 dots in float32 and cannot capture graphs)"
)  # fmt: skip


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(actual.float(), expected.float(), **TOL[dtype])


def assert_same_e4m3(q: torch.Tensor, q_ref: torch.Tensor) -> None:
    """Bit for bit under the interpreter. On a GPU a quotient may round differently from torch's
    (Triton's division): then at most one e4m3 step apart, in a handful of elements."""
    same = q.view(torch.uint8) == q_ref.view(torch.uint8)
    if not ON_GPU:
        assert same.all()
        return
    assert (~same).float().mean() < 1e-3
    a, b = q.float(), q_ref.float()
    assert ((a - b).abs() <= torch.maximum(a.abs(), b.abs()) * 2**-3 + 2**-9).all()


def assert_same_fp8_rows(actual: tuple, expected: tuple) -> None:
    """(q, scale) pairs equal bit for bit: a fused quantization against the same Triton math
    run as two kernels (the same float32 operations, so on a GPU too)."""
    (q, scale), (q_ref, scale_ref) = actual, expected
    assert q.dtype == q_ref.dtype == torch.float8_e4m3fn and q.shape == q_ref.shape
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert scale.dtype == torch.float32 and torch.equal(scale, scale_ref)


def assert_fp8_rows_close(actual: tuple, expected: tuple, dtype: torch.dtype) -> None:
    """(q, scale) pairs from inputs that may differ by the Triton-vs-torch tolerance TOL[dtype]
    (rms_norm's and silu_and_mul's own): scales within its rtol, and each dequantized value at
    most one e4m3 step (2^-3 relative, subnormals 2^-9 · scale) plus twice that rtol apart."""
    (q, scale), (q_ref, scale_ref) = actual, expected
    assert q.dtype == q_ref.dtype == torch.float8_e4m3fn and q.shape == q_ref.shape
    rtol = TOL[dtype]["rtol"]
    torch.testing.assert_close(scale, scale_ref, rtol=rtol, atol=0)
    a, b = q.float() * scale, q_ref.float() * scale_ref
    bound = torch.maximum(a.abs(), b.abs()) * (2**-3 + 2 * rtol) + scale_ref * 2**-9
    assert ((a - b).abs() <= bound).all()


def gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def randn(*shape: int, g: torch.Generator, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Fresh seeded N(0, 1) values, drawn on the CPU (same values on every device)."""
    return torch.randn(*shape, generator=g).to(device=DEVICE, dtype=dtype)


def paged_kv(
    seq_lens: list[int],
    *,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    g: torch.Generator,
    spare_blocks: int = 3,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random k/v caches and a shuffled block table for sequences of the given lengths.

    Blocks are handed out in a random order (never contiguous, never sorted); unused block-table
    entries are -1 so a kernel that reads past a sequence's blocks is caught. Returns
    (k_cache, v_cache, block_tables int32).
    """
    need = [(n + block_size - 1) // block_size for n in seq_lens]
    num_blocks = sum(need) + spare_blocks
    max_blocks = max([*need, 1]) + 1  # one spare column
    perm = torch.randperm(num_blocks, generator=g)
    table = torch.full((len(seq_lens), max_blocks), -1, dtype=torch.int32)
    used = 0
    for i, n in enumerate(need):
        table[i, :n] = perm[used : used + n].to(torch.int32)
        used += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = randn(*shape, g=g, dtype=dtype)
    v_cache = randn(*shape, g=g, dtype=dtype)
    return k_cache, v_cache, table.to(DEVICE)


def int_tensor(values: list[int], dtype: torch.dtype = torch.int32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=DEVICE)


def nan_like(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, float("nan"))


# The e4m3 KV caches of the decode tests hold K / K_SCALE and V / V_SCALE (K drawn 3x wider, as
# a model's keys are, so the scale matters).
K_SCALE, V_SCALE = 0.5, 2.0


def fp8_kv(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 k/v caches as e4m3 caches at K_SCALE / V_SCALE."""
    from kernels.fp8_quant import FP8_DTYPE
    from kernels.store_kv import to_cache_dtype

    return to_cache_dtype(k * 3, FP8_DTYPE, K_SCALE), to_cache_dtype(v, FP8_DTYPE, V_SCALE)
