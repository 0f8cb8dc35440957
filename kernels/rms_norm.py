# RMSNorm, optionally fused with the residual add that precedes it.
#   x, residual: [num_tokens, hidden]; weight: [hidden]
# With a residual: s = x + residual; returns (rms_norm(s) * weight, s).
# Without: rms_norm(x) * weight.
# Statistics in float32, output in x's dtype (as HF Llama does).
import torch
import triton
import triton.language as tl

from kernels._launch import (
    FLOAT_DTYPES,
    check_last_dim_contiguous,
    check_launchable,
    check_shape,
    check_tensor,
    next_power_of_2,
)


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    if residual is not None:
        x = (x.float() + residual.float()).to(x.dtype)
        summed = x
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    y = weight * h.to(x.dtype)
    return (y, summed) if residual is not None else y


# ---------------------------------------------------------------------------------------------
# Triton kernel. One program per row: the whole row (hidden rounded up to a power of two) is one
# tile, so the sum of squares is a single tl.sum. With a residual the program first forms
# s = x + residual (rounded to x's dtype, like the reference), writes it out, then normalises s.
# ---------------------------------------------------------------------------------------------
MAX_HIDDEN = 65536


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # [num_rows, hidden]
    residual_ptr,  # [num_rows, hidden] (unused without HAS_RESIDUAL)
    weight_ptr,  # [hidden]
    out_ptr,  # [num_rows, hidden]
    residual_out_ptr,  # [num_rows, hidden], receives x + residual
    hidden,
    eps,
    stride_x_row,
    stride_r_row,
    stride_o_row,
    stride_ro_row,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_N: tl.constexpr,  # hidden rounded up to a power of two
):
    row = tl.program_id(0).to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    mask = offs_n < hidden

    # x[row, n]
    x = tl.load(x_ptr + row * stride_x_row + offs_n, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        # residual[row, n]
        r = tl.load(residual_ptr + row * stride_r_row + offs_n, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        # residual_out[row, n]
        tl.store(residual_out_ptr + row * stride_ro_row + offs_n, x, mask=mask)

    h = x.to(tl.float32)
    mean_sq = tl.sum(h * h, axis=0) / hidden  # masked lanes are 0 and do not count
    rstd = 1.0 / tl.sqrt(mean_sq + eps)
    # like the reference: normalise in float32, round to x's dtype, then scale by the weight
    normed = (h * rstd).to(x.dtype).to(tl.float32)
    w = tl.load(weight_ptr + offs_n, mask=mask, other=0.0).to(tl.float32)  # weight[n]
    y = normed * w
    # out[row, n]
    tl.store(out_ptr + row * stride_o_row + offs_n, y.to(out_ptr.dtype.element_ty), mask=mask)


def _as_rows(name: str, t: torch.Tensor, hidden: int) -> torch.Tensor:
    """[..., hidden] → a 2-D [rows, hidden] view with a contiguous last dim (no copy)."""
    check_last_dim_contiguous(name, t)
    if t.dim() == 2:
        return t
    try:
        return t.view(-1, hidden)
    except RuntimeError as e:
        raise ValueError(f"{name} with shape {tuple(t.shape)} cannot be viewed as rows") from e


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of `rms_norm_ref`.

    x: [..., hidden] (2-D inputs may have any row stride; higher ranks must view as rows).
    Returns rms_norm(x) * weight, or with a residual (out, x + residual). The output dtype is the
    reference's: promote(x.dtype, weight.dtype), i.e. x's dtype when weight matches.
    `out` / `residual_out` may be given (static CUDA-graph buffers); each may alias its input
    (x / residual): every element is read before it is written by the same program.
    """
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError("x must be a tensor of shape [..., hidden]")
    check_tensor("x", x, ndim=x.dim(), dtypes=FLOAT_DTYPES)
    device = x.device
    hidden = x.shape[-1]
    check_tensor("weight", weight, ndim=1, dtypes=FLOAT_DTYPES, device=device)
    check_shape("weight", weight, (hidden,))
    if not weight.is_contiguous():
        raise ValueError("weight must be contiguous")
    if hidden == 0 or hidden > MAX_HIDDEN:
        raise ValueError(f"hidden size must be in [1, {MAX_HIDDEN}], got {hidden}")
    out_dtype = torch.promote_types(x.dtype, weight.dtype)
    if out is None:
        out = torch.empty(x.shape, dtype=out_dtype, device=device)
    check_tensor("out", out, ndim=x.dim(), dtypes=(out_dtype,), device=device)
    check_shape("out", out, tuple(x.shape))
    x2 = _as_rows("x", x, hidden)
    o2 = _as_rows("out", out, hidden)
    if residual is not None:
        check_tensor("residual", residual, ndim=x.dim(), dtypes=(x.dtype,), device=device)
        check_shape("residual", residual, tuple(x.shape))
        if residual_out is None:
            residual_out = torch.empty_like(x, memory_format=torch.contiguous_format)
        check_tensor("residual_out", residual_out, ndim=x.dim(), dtypes=(x.dtype,), device=device)
        check_shape("residual_out", residual_out, tuple(x.shape))
        r2 = _as_rows("residual", residual, hidden)
        ro2 = _as_rows("residual_out", residual_out, hidden)
    elif residual_out is not None:
        raise ValueError("residual_out given without residual")
    else:
        r2 = ro2 = x2  # placeholders, never touched (HAS_RESIDUAL=False)

    num_rows = x2.shape[0]
    if num_rows:
        check_launchable(x)
        BLOCK_N = next_power_of_2(hidden)
        num_warps = 1 if BLOCK_N <= 512 else 4 if BLOCK_N <= 4096 else 8 if BLOCK_N <= 16384 else 16
        _rms_norm_kernel[(num_rows,)](
            x2,
            r2,
            weight,
            o2,
            ro2,
            hidden,
            float(eps),
            x2.stride(0),
            r2.stride(0),
            o2.stride(0),
            ro2.stride(0),
            HAS_RESIDUAL=residual is not None,
            BLOCK_N=BLOCK_N,
            num_warps=num_warps,
        )
    return (out, residual_out) if residual is not None else out
