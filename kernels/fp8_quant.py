# FP8 (e4m3) activation quantization for the FP8 linear layers, one scale per token (row).
#   x:     [num_tokens, K] float (bf16 / fp16 / fp32)
#   q:     [num_tokens, K] float8_e4m3fn, q = clamp(x / scale) rounded to nearest even
#   scale: [num_tokens, 1] float32, the dequantization factor (x ≈ q * scale)
# Dynamic: scale = min(max|x_row|, scale_ub) / 448 (scale_ub caps outlier tokens, as Meta's FP8
# checkpoints ask; 0 = no cap). Static: every row takes the one given scale (the per-tensor
# input_scale of compressed-tensors checkpoints).
import torch
import triton
import triton.language as tl

from kernels._launch import (
    FLOAT_DTYPES,
    check_last_dim_contiguous,
    check_launchable,
    check_tensor,
    interpreting,
)

FP8_DTYPE = torch.float8_e4m3fn
E4M3_MAX = 448.0  # largest finite e4m3fn value
MIN_SCALE = 1e-12 / E4M3_MAX  # an all-zero row still gets a positive scale


def kv_scales(cache_dtype: torch.dtype, k_scale: float, v_scale: float) -> tuple[float, float]:
    """The scales a KV cache's reader applies: an e4m3 cache's; a float cache stores K and V as
    they are, whatever scales the layer carries."""
    return (float(k_scale), float(v_scale)) if cache_dtype == FP8_DTYPE else (1.0, 1.0)


def quantize_fp8_ref(
    x: torch.Tensor, scale: torch.Tensor | None = None, scale_ub: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, per-row scale) as described above; `scale` (1 element) makes it static."""
    xf = x.float()
    if scale is None:
        amax = xf.abs().amax(dim=-1, keepdim=True)
        if scale_ub > 0:
            amax = amax.clamp(max=scale_ub)
        row_scale = (amax / E4M3_MAX).clamp(min=MIN_SCALE)
    else:
        row_scale = scale.float().reshape(1, 1).expand(x.shape[0], 1).contiguous()
    q = (xf / row_scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)
    return q, row_scale


# ---------------------------------------------------------------------------------------------
# Triton. `round_to_e4m3` is shared with store_kv (FP8 KV cache): Triton's CPU interpreter
# converts float32 to fp8 by truncating the mantissa and adding the cut-off bit without a carry
# into the exponent (7.96 → 4.0), so under TRITON_INTERPRET the value is first rounded onto the
# e4m3 grid in float32 (exactly representable values convert exactly). On a GPU the hardware
# conversion (round to nearest even) runs directly.
# ---------------------------------------------------------------------------------------------
@triton.jit
def round_to_e4m3(x, ROUND_IN_FP32: tl.constexpr):
    """x: float32 already clamped to [-448, 448] → the nearest e4m3 value, still float32."""
    if ROUND_IN_FP32:
        bits = x.to(tl.int32, bitcast=True)
        exponent = ((bits >> 23) & 0xFF) - 127  # unbiased float32 exponent
        exponent = tl.maximum(exponent, -6)  # e4m3 subnormals share the quantum 2^-9
        quantum = tl.exp2((exponent - 3).to(tl.float32))  # 3 mantissa bits
        y = tl.abs(x) / quantum  # exact: quantum is a power of two; y < 16
        y = (y + 12582912.0) - 12582912.0  # 1.5 * 2^23: float32 round to nearest even
        # the sign bit, times -1.0 (unary minus is 0 - x): -0.0 and values rounding to zero
        # from below stay -0.0, as torch's conversion gives
        x = tl.where(bits < 0, y * quantum * -1.0, y * quantum)
    return x


@triton.jit
def fp8_row_scale(row_max, scale_ub, static_scale_ptr, STATIC: tl.constexpr):
    """A row's dequantization scale, as quantize_fp8_ref: the one static scale, or
    min(max|x_row|, scale_ub if > 0) / 448 (never below MIN_SCALE). row_max: float32 scalar
    (ignored when STATIC). Shared by every kernel that emits e4m3 activations (rms_norm.py,
    silu_mul.py), so fused and separate quantization give the same bits."""
    if STATIC:
        scale = tl.load(static_scale_ptr).to(tl.float32)
    else:
        if scale_ub > 0:
            row_max = tl.minimum(row_max, scale_ub)
        scale = tl.maximum(row_max / 448.0, 1e-12 / 448.0)
    return scale


@triton.jit
def quantize_e4m3(x, scale, ROUND_IN_FP32: tl.constexpr):
    """x: float32 tile, scale: its row's scale → x / scale clamped to ±448 on the e4m3 grid
    (float32; the caller's store converts it)."""
    y = tl.clamp(x / scale, -448.0, 448.0)
    return round_to_e4m3(y, ROUND_IN_FP32)


@triton.jit
def _quantize_fp8_kernel(
    x_ptr,  # [num_rows, K]
    q_ptr,  # [num_rows, K] fp8
    scale_ptr,  # [num_rows] float32, written (dynamic) or ignored
    static_scale_ptr,  # [1] float32 when STATIC
    K,
    stride_x_row,
    stride_q_row,
    scale_ub,  # > 0: cap of the dynamic amax
    STATIC: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ROUND_IN_FP32: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x_row  # x[row, :]
    q_row = q_ptr + row * stride_q_row  # q[row, :]
    row_max = 0.0
    if not STATIC:
        # pass 1: the row's absolute maximum, tile by tile
        amax = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x))
        row_max = tl.max(amax, axis=0)
    scale = fp8_row_scale(row_max, scale_ub, static_scale_ptr, STATIC)
    tl.store(scale_ptr + row, scale)
    # pass 2: quantize
    for k0 in range(0, K, BLOCK_K):
        offs = k0 + tl.arange(0, BLOCK_K)
        mask = offs < K
        x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        y = quantize_e4m3(x, scale, ROUND_IN_FP32)
        tl.store(q_row + offs, y.to(q_ptr.dtype.element_ty), mask=mask)


def check_static_scale(scale: torch.Tensor | None, device: torch.device) -> None:
    """A static activation scale: one float32 element on the activations' device."""
    if scale is None:
        return
    check_tensor("scale", scale, ndim=scale.dim(), dtypes=(torch.float32,), device=device)
    if scale.numel() != 1:
        raise ValueError(f"a static scale has one element, got {tuple(scale.shape)}")


def quantize_fp8(
    x: torch.Tensor,
    scale: torch.Tensor | None = None,
    scale_ub: float = 0.0,
    *,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of `quantize_fp8_ref`: x [num_rows, K] (last dim contiguous) → (q, scale)."""
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    check_last_dim_contiguous("x", x)
    num_rows, K = x.shape
    check_static_scale(scale, x.device)
    if out is None:
        out = torch.empty((num_rows, K), dtype=FP8_DTYPE, device=x.device)
    row_scale = torch.empty((num_rows, 1), dtype=torch.float32, device=x.device)
    if num_rows == 0 or K == 0:
        return out, row_scale
    check_launchable(x)
    BLOCK_K = min(2048, triton.next_power_of_2(K))
    _quantize_fp8_kernel[(num_rows,)](
        x,
        out,
        row_scale,
        scale if scale is not None else row_scale,
        K,
        x.stride(0),
        out.stride(0),
        float(scale_ub),
        STATIC=scale is not None,
        BLOCK_K=BLOCK_K,
        ROUND_IN_FP32=interpreting(),
        num_warps=8 if BLOCK_K >= 2048 else 4,
    )
    return out, row_scale
