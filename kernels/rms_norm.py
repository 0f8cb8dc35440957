# RMSNorm, optionally fused with the residual add that precedes it.
#   x, residual: [num_tokens, hidden]; weight: [hidden]
# With a residual: s = x + residual; returns (rms_norm(s) * weight, s).
# Without: rms_norm(x) * weight.
# Statistics in float32, output in x's dtype (as HF Llama does).
# rms_norm_fp8: the same, with the output quantized to e4m3 per row in the same pass, for an FP8
# linear layer that follows (engine/models/fp8_activation.py): q [num_tokens, hidden] e4m3 and
# scale [num_tokens, 1] float32, bit for bit what quantize_fp8 (kernels/fp8_quant.py) makes of
# rms_norm's output: the normalised row is rounded to x's dtype in registers first.
import torch
import triton
import triton.language as tl

from kernels._launch import (
    FLOAT_DTYPES,
    check_last_dim_contiguous,
    check_launchable,
    check_shape,
    check_tensor,
    interpreting,
    next_power_of_2,
)
from kernels.fp8_quant import (
    FP8_DTYPE,
    check_static_scale,
    fp8_row_scale,
    quantize_e4m3,
    quantize_fp8_ref,
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


def rms_norm_fp8_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    input_scale: torch.Tensor | None = None,
    scale_ub: float = 0.0,
) -> tuple[torch.Tensor, ...]:
    """(q, scale) or with a residual (q, scale, x + residual): rms_norm_ref, then
    quantize_fp8_ref of its output rows."""
    out = rms_norm_ref(x, weight, eps, residual)
    y, summed = out if residual is not None else (out, None)
    q, scale = quantize_fp8_ref(y.reshape(-1, y.shape[-1]), input_scale, scale_ub)
    q = q.view(y.shape)
    return (q, scale) if summed is None else (q, scale, summed)


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
    out_ptr,  # [num_rows, hidden]: x's dtype, or e4m3 with QUANT
    residual_out_ptr,  # [num_rows, hidden], receives x + residual
    scale_ptr,  # [num_rows] float32, the rows' e4m3 scales (QUANT only)
    static_scale_ptr,  # [1] float32 (QUANT and STATIC only)
    hidden,
    eps,
    scale_ub,  # > 0: cap of a row's amax (QUANT only)
    stride_x_row,
    stride_r_row,
    stride_o_row,
    stride_ro_row,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_N: tl.constexpr,  # hidden rounded up to a power of two
    QUANT: tl.constexpr,  # out is e4m3, one scale per row
    STATIC: tl.constexpr,  # QUANT with the one static scale
    ROUND_IN_FP32: tl.constexpr,  # see fp8_quant.round_to_e4m3
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
    if QUANT:
        # what rms_norm would store (x's dtype: the launcher checks weight has it too), then
        # quantize_fp8's per-row scale and rounding, on the row already in registers
        y = y.to(x.dtype).to(tl.float32)
        scale = fp8_row_scale(tl.max(tl.abs(y), axis=0), scale_ub, static_scale_ptr, STATIC)
        tl.store(scale_ptr + row, scale)
        y = quantize_e4m3(y, scale, ROUND_IN_FP32)
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
    _check_inputs(x, weight)
    out_dtype = torch.promote_types(x.dtype, weight.dtype)
    if out is None:
        out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    check_tensor("out", out, ndim=x.dim(), dtypes=(out_dtype,), device=x.device)
    residual_out = _launch(x, weight, eps, residual, out, residual_out, None)
    return (out, residual_out) if residual is not None else out


def rms_norm_fp8(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    input_scale: torch.Tensor | None = None,
    scale_ub: float = 0.0,
    *,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """Triton twin of `rms_norm_fp8_ref`: (q [..., hidden] e4m3, scale [rows, 1] float32), with
    a residual (q, scale, x + residual). input_scale / scale_ub as quantize_fp8's; weight must
    have x's dtype (the dtype the unfused output would have been rounded to)."""
    _check_inputs(x, weight)
    if weight.dtype != x.dtype:
        raise ValueError(f"weight ({weight.dtype}) must have x's dtype ({x.dtype})")
    check_static_scale(input_scale, x.device)
    if out is None:
        out = torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device)
    check_tensor("out", out, ndim=x.dim(), dtypes=(FP8_DTYPE,), device=x.device)
    num_rows = x.numel() // x.shape[-1]
    scale = torch.empty((num_rows, 1), dtype=torch.float32, device=x.device)
    quant = (scale, input_scale, float(scale_ub))
    residual_out = _launch(x, weight, eps, residual, out, residual_out, quant)
    return (out, scale) if residual is None else (out, scale, residual_out)


def _check_inputs(x: torch.Tensor, weight: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError("x must be a tensor of shape [..., hidden]")
    check_tensor("x", x, ndim=x.dim(), dtypes=FLOAT_DTYPES)
    hidden = x.shape[-1]
    check_tensor("weight", weight, ndim=1, dtypes=FLOAT_DTYPES, device=x.device)
    check_shape("weight", weight, (hidden,))
    if not weight.is_contiguous():
        raise ValueError("weight must be contiguous")
    if hidden == 0 or hidden > MAX_HIDDEN:
        raise ValueError(f"hidden size must be in [1, {MAX_HIDDEN}], got {hidden}")


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None,
    out: torch.Tensor,
    residual_out: torch.Tensor | None,
    quant: tuple[torch.Tensor, torch.Tensor | None, float] | None,  # (scale, static, scale_ub)
) -> torch.Tensor | None:
    """Checks the shapes of out and residual(_out), launches one program per row (out's dtype
    was checked by the caller); → residual_out."""
    device, hidden = x.device, x.shape[-1]
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
    scale, static, scale_ub = quant if quant is not None else (x2, None, 0.0)

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
            scale,
            static if static is not None else scale,
            hidden,
            float(eps),
            scale_ub,
            x2.stride(0),
            r2.stride(0),
            o2.stride(0),
            ro2.stride(0),
            HAS_RESIDUAL=residual is not None,
            BLOCK_N=BLOCK_N,
            QUANT=quant is not None,
            STATIC=static is not None,
            ROUND_IN_FP32=interpreting(),
            num_warps=num_warps,
        )
    return residual_out
