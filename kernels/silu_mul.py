# SiLU-and-mul of the fused gate/up projection.
#   x: [num_tokens, 2 * intermediate] (gate first, then up) → [num_tokens, intermediate]
# silu_and_mul_fp8: the same, quantized to e4m3 per row for an FP8 down projection
# (engine/models/fp8_activation.py): q [num_tokens, intermediate] e4m3 and scale [num_tokens, 1]
# float32, bit for bit what quantize_fp8 (kernels/fp8_quant.py) makes of silu_and_mul's output.
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._launch import (
    FLOAT_DTYPES,
    check_last_dim_contiguous,
    check_launchable,
    check_tensor,
    interpreting,
    output_buffer,
)
from kernels.fp8_quant import (
    FP8_DTYPE,
    check_static_scale,
    fp8_row_scale,
    quantize_e4m3,
    quantize_fp8_ref,
)


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_and_mul_fp8_ref(
    x: torch.Tensor, input_scale: torch.Tensor | None = None, scale_ub: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [num_rows, 2 * inter] → (q [num_rows, inter] e4m3, scale [num_rows, 1] float32)."""
    return quantize_fp8_ref(silu_and_mul_ref(x), input_scale, scale_ub)


# ---------------------------------------------------------------------------------------------
# Triton kernels. As in the reference, silu(gate) is rounded to the input dtype before the
# multiply (F.silu returns the input dtype), and the product to the input dtype after it.
# ---------------------------------------------------------------------------------------------
@triton.jit
def _silu_and_mul_tile(x_row, offs, mask, inter):
    """x_row: &x[row, 0]; offs: [BLOCK] columns → silu(x[row, offs]) * x[row, inter + offs] in
    x's dtype (masked lanes are 0)."""
    gate = tl.load(x_row + offs, mask=mask, other=0.0)
    up = tl.load(x_row + inter + offs, mask=mask, other=0.0).to(tl.float32)
    g = gate.to(tl.float32)
    # sigmoid from e = exp(-|g|) in (0, 1]: never overflows, for either sign of g
    e = tl.exp(-tl.abs(g))
    sigmoid = tl.where(g >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    silu = (g * sigmoid).to(gate.dtype).to(tl.float32)
    return (silu * up).to(gate.dtype)


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,  # [num_rows, 2 * inter]: gate in [:, :inter], up in [:, inter:]
    out_ptr,  # [num_rows, inter]
    inter,
    stride_x_row,
    stride_o_row,
    BLOCK: tl.constexpr,
):
    # program (row, column tile)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK] columns
    mask = offs < inter
    y = _silu_and_mul_tile(x_ptr + row * stride_x_row, offs, mask, inter)
    tl.store(out_ptr + row * stride_o_row + offs, y, mask=mask)  # out[row, offs]


# A row's scale needs the amax of all `inter` outputs before the first one can be quantized.
# Chosen for a decode step (<= FP8_SKINNY_MAX_ROWS = 64 rows; the 70B's inter is 28,672, so a
# row's gate and up are 112 KiB of bf16): ONE PROGRAM PER ROW THAT COMPUTES silu * up TWICE,
# pass 1 for the amax, pass 2 to quantize and store. Pass 2 re-reads the row from L2 (<= 64 rows
# x 112 KiB = 7 MiB, far inside the H200's 50 MiB), nothing intermediate goes to memory, and it
# is one launch. The alternatives: (a) many programs per row writing tile amaxes (and the bf16
# product) to a workspace, then a second kernel to reduce and quantize: more SMs busy, but two
# launches and a round trip again, which is what silu_and_mul + quantize_fp8 already cost (and
# the launches are the cost to remove: a decode step's activations are a few MiB); (b) the whole
# row in one program's registers: 28,672 floats = 112 KiB per program, it would spill. The
# separate quantize_fp8 also runs one program per row over this row, so this moves the silu into
# it and drops the product's write and re-read. A 1-row step runs one program (~230 KB of loads
# through one SM); benchmarks/kernel_bench/fp8.py times it against the two kernels.
@triton.jit
def _silu_and_mul_fp8_kernel(
    x_ptr,  # [num_rows, 2 * inter]: gate in [:, :inter], up in [:, inter:]
    q_ptr,  # [num_rows, inter] e4m3
    scale_ptr,  # [num_rows] float32
    static_scale_ptr,  # [1] float32 when STATIC
    inter,
    scale_ub,  # > 0: cap of a row's amax
    stride_x_row,
    stride_q_row,
    STATIC: tl.constexpr,  # every row takes the static scale: pass 1 is skipped
    BLOCK: tl.constexpr,
    ROUND_IN_FP32: tl.constexpr,  # see fp8_quant.round_to_e4m3
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x_row  # x[row, :]
    q_row = q_ptr + row * stride_q_row  # q[row, :]
    row_max = 0.0
    if not STATIC:
        # pass 1: the row's absolute maximum of silu(gate) * up, tile by tile
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for c0 in range(0, inter, BLOCK):
            offs = c0 + tl.arange(0, BLOCK)
            y = _silu_and_mul_tile(x_row, offs, offs < inter, inter).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(y))
        row_max = tl.max(amax, axis=0)
    scale = fp8_row_scale(row_max, scale_ub, static_scale_ptr, STATIC)
    tl.store(scale_ptr + row, scale)
    # pass 2: the same products again (inputs from L2), quantized
    for c0 in range(0, inter, BLOCK):
        offs = c0 + tl.arange(0, BLOCK)
        mask = offs < inter
        y = _silu_and_mul_tile(x_row, offs, mask, inter).to(tl.float32)
        y = quantize_e4m3(y, scale, ROUND_IN_FP32)
        tl.store(q_row + offs, y.to(q_ptr.dtype.element_ty), mask=mask)


def _as_rows(x: torch.Tensor, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., 2 * inter] and out [..., inter] as 2-D row views (no copy)."""
    if x.dim() == 2:
        return x, out
    try:
        return x.view(-1, x.shape[-1]), out.view(-1, out.shape[-1])
    except RuntimeError as e:
        raise ValueError("x and out must view as rows [num_rows, last_dim]") from e


def _check_x(x: torch.Tensor) -> int:
    """→ inter"""
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError("x must be a tensor of shape [..., 2 * intermediate]")
    check_tensor("x", x, ndim=x.dim(), dtypes=FLOAT_DTYPES)
    if x.shape[-1] % 2:
        raise ValueError(f"x's last dim must be even (gate and up halves), got {x.shape[-1]}")
    check_last_dim_contiguous("x", x)
    return x.shape[-1] // 2


def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Triton twin of `silu_and_mul_ref`: x [..., 2 * inter] → [..., inter] in x's dtype.

    A 2-D x may have any row stride; higher ranks must view as rows. `out` may be given.
    """
    inter = _check_x(x)
    out = output_buffer("out", out, (*x.shape[:-1], inter), x)
    x2, o2 = _as_rows(x, out)
    num_rows = x2.shape[0]
    if num_rows == 0 or inter == 0:
        return out
    check_launchable(x)
    BLOCK = min(1024, triton.next_power_of_2(inter))
    grid = (num_rows, triton.cdiv(inter, BLOCK))
    _silu_and_mul_kernel[grid](
        x2,
        o2,
        inter,
        x2.stride(0),
        o2.stride(0),
        BLOCK=BLOCK,
        num_warps=4 if BLOCK >= 512 else 1,
    )
    return out


def silu_and_mul_fp8(
    x: torch.Tensor,
    input_scale: torch.Tensor | None = None,
    scale_ub: float = 0.0,
    *,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of `silu_and_mul_fp8_ref`: x [..., 2 * inter] → (q [..., inter] e4m3,
    scale [num_rows, 1] float32). input_scale / scale_ub as quantize_fp8's."""
    inter = _check_x(x)
    check_static_scale(input_scale, x.device)
    like = torch.empty(0, dtype=FP8_DTYPE, device=x.device)
    out = output_buffer("out", out, (*x.shape[:-1], inter), like)
    x2, q2 = _as_rows(x, out)
    num_rows = x2.shape[0]
    scale = torch.empty((num_rows, 1), dtype=torch.float32, device=x.device)
    if num_rows == 0 or inter == 0:
        return out, scale
    check_launchable(x)
    BLOCK = min(2048, triton.next_power_of_2(inter))
    _silu_and_mul_fp8_kernel[(num_rows,)](
        x2,
        q2,
        scale,
        input_scale if input_scale is not None else scale,
        inter,
        float(scale_ub),
        x2.stride(0),
        q2.stride(0),
        STATIC=input_scale is not None,
        BLOCK=BLOCK,
        ROUND_IN_FP32=interpreting(),
        num_warps=8 if BLOCK >= 2048 else 4,
    )
    return out, scale
