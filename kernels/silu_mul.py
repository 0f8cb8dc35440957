# SiLU-and-mul of the fused gate/up projection.
#   x: [num_tokens, 2 * intermediate] (gate first, then up) → [num_tokens, intermediate]
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._launch import (
    FLOAT_DTYPES,
    check_last_dim_contiguous,
    check_launchable,
    check_tensor,
    output_buffer,
)


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


# ---------------------------------------------------------------------------------------------
# Triton kernel. Program (row, column tile) reads BLOCK gate and BLOCK up values of one row and
# writes silu(gate) * up. As in the reference, silu(gate) is rounded to the input dtype before
# the multiply (F.silu returns the input dtype).
# ---------------------------------------------------------------------------------------------
@triton.jit
def _silu_and_mul_kernel(
    x_ptr,  # [num_rows, 2 * inter]: gate in [:, :inter], up in [:, inter:]
    out_ptr,  # [num_rows, inter]
    inter,
    stride_x_row,
    stride_o_row,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK] columns
    mask = offs < inter

    gate_ptrs = x_ptr + row * stride_x_row + offs  # x[row, offs]
    up_ptrs = x_ptr + row * stride_x_row + inter + offs  # x[row, inter + offs]
    gate = tl.load(gate_ptrs, mask=mask, other=0.0)
    up = tl.load(up_ptrs, mask=mask, other=0.0).to(tl.float32)
    g = gate.to(tl.float32)
    # sigmoid from e = exp(-|g|) in (0, 1]: never overflows, for either sign of g
    e = tl.exp(-tl.abs(g))
    sigmoid = tl.where(g >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    silu = (g * sigmoid).to(gate.dtype).to(tl.float32)
    y = (silu * up).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_o_row + offs, y, mask=mask)  # out[row, offs]


def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Triton twin of `silu_and_mul_ref`: x [..., 2 * inter] → [..., inter] in x's dtype.

    A 2-D x may have any row stride; higher ranks must view as rows. `out` may be given.
    """
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError("x must be a tensor of shape [..., 2 * intermediate]")
    check_tensor("x", x, ndim=x.dim(), dtypes=FLOAT_DTYPES)
    if x.shape[-1] % 2:
        raise ValueError(f"x's last dim must be even (gate and up halves), got {x.shape[-1]}")
    inter = x.shape[-1] // 2
    out_shape = (*x.shape[:-1], inter)
    check_last_dim_contiguous("x", x)
    out = output_buffer("out", out, out_shape, x)
    if x.dim() == 2:
        x2, o2 = x, out
    else:
        try:
            x2, o2 = x.view(-1, 2 * inter), out.view(-1, inter)
        except RuntimeError as e:
            raise ValueError("x and out must view as rows [num_rows, last_dim]") from e
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
