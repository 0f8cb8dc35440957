# FP8 linear math: per-output-channel weight quantization (at load) and the FP8 matmul of a
# layer's forward. On Hopper a decode step's few rows (<= 64) take the split-K skinny GEMM over
# the e4m3 operands (kernels/skinny_gemm.py: 1.3-1.75x faster than cuBLAS there); more rows take
# torch._scaled_mm over e4m3 operands with float32 accumulation and row-wise scales;
# elsewhere (the CPU, fp32 models, shapes cuBLAS rejects) fp8_matmul_ref computes the same thing
# on dequantized values, so CI runs every step up to the matmul itself:
#   x: [num_tokens, K] → per-token e4m3 x_q with x_scale [num_tokens, 1] (kernels/fp8_quant.py;
#      at a decode step's row counts fused into the op that makes x: fp8_activation.py)
#   w: [N, K] e4m3 with w_scale [N] float32
#   y[t, n] = (Σ_k x_q[t, k] · w_q[n, k]) · x_scale[t] · w_scale[n]
from __future__ import annotations

import torch

from engine.models.fp8_activation import Fp8Activation, quantize_activation
from kernels._launch import capability
from kernels.fp8_quant import E4M3_MAX, FP8_DTYPE, MIN_SCALE


@torch.no_grad()
def quantize_weight(
    w: torch.Tensor, rows_per_chunk: int = 4096
) -> tuple[torch.Tensor, torch.Tensor]:
    """w: [N, K] float → (e4m3 [N, K], scale [N] float32), one scale per output channel,
    a chunk of rows at a time (the float32 copy of a 70B projection never exists whole)."""
    q = torch.empty(w.shape, dtype=FP8_DTYPE, device=w.device)
    scale = torch.empty(w.shape[0], dtype=torch.float32, device=w.device)
    for start in range(0, w.shape[0], rows_per_chunk):
        rows = w[start : start + rows_per_chunk].float()
        s = (rows.abs().amax(dim=1) / E4M3_MAX).clamp(min=MIN_SCALE)
        q[start : start + rows_per_chunk] = (
            (rows / s[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)
        )
        scale[start : start + rows_per_chunk] = s
    return q, scale


def dequantize_weight(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The inverse: e4m3 [N, K] and scale [N] → [N, K] in `dtype`."""
    return (q.float() * scale.float()[:, None]).to(dtype)


def fp8_matmul_ref(
    x_q: torch.Tensor,  # [M, K] e4m3
    x_scale: torch.Tensor,  # [M, 1] float32
    w_q: torch.Tensor,  # [N, K] e4m3
    w_scale: torch.Tensor,  # [N] float32
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """Torch twin of torch._scaled_mm(x_q, w_q.t(), x_scale, w_scale[None]): e4m3 products
    summed in float32, then both scales."""
    y = torch.matmul(x_q.float(), w_q.float().t())
    return (y * x_scale * w_scale[None, :]).to(out_dtype)


def uses_scaled_mm(
    x: torch.Tensor, w_q: torch.Tensor, out_dtype: torch.dtype | None = None
) -> bool:
    """torch._scaled_mm with row-wise scales: Hopper or newer, bf16 output (out_dtype, else x's
    dtype), both weight dimensions multiples of 16."""
    if not x.is_cuda or (out_dtype or x.dtype) != torch.bfloat16:
        return False
    n, k = w_q.shape
    # Row-wise scaled FP8 GEMMs (torch's CUTLASS kernel) need sm90; Ada's FP8 tensor cores
    # take only per-tensor scales there, so Ada runs the reference path.
    return capability(x.device) >= (9, 0) and n % 16 == 0 and k % 16 == 0


def fp8_linear(
    x: torch.Tensor | Fp8Activation,  # [..., K] in the model dtype, or its e4m3 rows [T, K]
    w_q: torch.Tensor,  # [N, K] e4m3
    w_scale: torch.Tensor,  # [N] float32
    input_scale: torch.Tensor | None = None,  # [1] float32: static per-tensor activations
    scale_ub: float = 0.0,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """x @ dequant(w_q)^T (+ bias) → [..., N] in the model dtype. x is quantized to e4m3 per
    token here unless the op that made it already did (fp8_activation.py); input_scale and
    scale_ub say how, and must be what that op was given."""
    if isinstance(x, Fp8Activation):
        act, out_shape = x, (x.q.shape[0], w_q.shape[0])
    else:
        act, out_shape = (
            quantize_activation(x, input_scale, scale_ub),
            (*x.shape[:-1], w_q.shape[0]),
        )
    x_q, x_scale, dtype = act.q, act.scale, act.dtype
    config = None
    if x_q.is_cuda:
        from kernels.skinny_gemm import skinny_config, skinny_gemm

        config = skinny_config(x_q, w_q)
    if config is not None:
        # a decode step's few rows: the split-K skinny GEMM streams the e4m3 weight once
        y = skinny_gemm(x_q, w_q, w_scale=w_scale, x_scale=x_scale, out_dtype=dtype, config=config)
    elif uses_scaled_mm(x_q, w_q, dtype):
        y = torch._scaled_mm(
            x_q, w_q.t(), scale_a=x_scale, scale_b=w_scale[None, :], out_dtype=dtype
        )
    else:
        y = fp8_matmul_ref(x_q, x_scale, w_q, w_scale, dtype)
    if bias is not None:
        y = y + bias
    return y.reshape(out_shape)
