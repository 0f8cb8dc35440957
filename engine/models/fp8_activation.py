# An FP8 linear layer's input as e4m3 rows with one float32 scale per row (W8A8, fp8.py), made
# either by the layer itself (quantize_activation: kernels/fp8_quant.py) or, at a decode step's
# row counts, by the op that produces the input, in the same kernel: the RMSNorm (with its
# residual add) before qkv_proj and gate_up_proj (kernels/rms_norm.py: rms_norm_fp8) and the
# SiLU-and-mul before down_proj (kernels/silu_mul.py: silu_and_mul_fp8). A 70B decode step
# otherwise runs one quantize_fp8 per FP8 layer (4 x 80); fused, only o_proj's remains (its input
# is the attention output). Both ways give the same bits: the fused kernels round the op's
# output to the model dtype in registers, then apply quantize_fp8's own scale rule and rounding
# (shared @triton.jit helpers). CUDA tensors take the Triton kernels, others the torch twins.
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernels.fp8_quant import quantize_fp8_ref
from kernels.rms_norm import rms_norm_fp8_ref
from kernels.silu_mul import silu_and_mul_fp8_ref
from kernels.skinny_gemm import FP8_SKINNY_MAX_ROWS

# Rows up to which the op before an FP8 layer quantizes its output: the decode steps that take
# the split-K skinny GEMM. Larger batches (prompt chunks) keep the separate quantize_fp8: there
# the GEMMs dwarf the extra launch, and silu_and_mul_fp8's one program per row (two passes over
# it) is shaped for a few rows.
FUSED_MAX_ROWS = FP8_SKINNY_MAX_ROWS
# Off: every FP8 layer quantizes its own input (tests compare the two; benchmarks/
# decode_breakdown.py --unfused-fp8-quant times the step without fusion).
FUSE_ACTIVATION_QUANT = True
# The SiLU-and-mul's fusion is off by default: measured on the H200 (70B FP8, 64 rows, 2k context,
# benchmarks/decode_breakdown.py), silu_and_mul_fp8 took 1.63 ms a step against 0.31 ms for
# silu_and_mul plus ~0.24 ms for down_proj's quantize_fp8: one program per row leaves most SMs
# idle and reads the 28,672-wide row twice. The norm's fusion wins (0.51 ms against 0.44 ms plus
# ~0.48 ms of quantize_fp8 for qkv and gate_up) and stays on. On: the fused kernel runs (tests).
FUSE_SILU_MUL_QUANT = False


@dataclass(frozen=True, slots=True)
class Fp8Activation:
    q: torch.Tensor  # [num_tokens, K] e4m3
    scale: torch.Tensor  # [num_tokens, 1] float32: x ≈ q * scale
    dtype: torch.dtype  # the model dtype: the unquantized input's, and the layer output's


def fuses_quantization(x: torch.Tensor) -> bool:
    """Whether the op that makes x ([..., K]) hands it to an FP8 layer quantized."""
    return FUSE_ACTIVATION_QUANT and math.prod(x.shape[:-1]) <= FUSED_MAX_ROWS


def quantize_activation(
    x: torch.Tensor, input_scale: torch.Tensor | None, scale_ub: float
) -> Fp8Activation:
    """x: [..., K] in the model dtype → its rows quantized per token (or with the static
    input_scale)."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.is_cuda:
        from kernels.fp8_quant import quantize_fp8

        q, scale = quantize_fp8(x2.contiguous(), input_scale, scale_ub)
    else:
        q, scale = quantize_fp8_ref(x2, input_scale, scale_ub)
    return Fp8Activation(q, scale, x.dtype)


def rms_norm_to_fp8(
    x: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden], x's dtype
    eps: float,
    residual: torch.Tensor | None,
    input_scale: torch.Tensor | None,
    scale_ub: float,
) -> Fp8Activation | tuple[Fp8Activation, torch.Tensor]:
    """ops.rms_norm's result with the normalised rows quantized: the activation, or with a
    residual (the activation, x + residual)."""
    if x.is_cuda:
        from kernels.rms_norm import rms_norm_fp8

        out = rms_norm_fp8(x, weight, eps, residual, input_scale, scale_ub)
    else:
        out = rms_norm_fp8_ref(x, weight, eps, residual, input_scale, scale_ub)
    act = Fp8Activation(out[0], out[1], x.dtype)
    return act if residual is None else (act, out[2])


def silu_and_mul_to_fp8(
    x: torch.Tensor,  # [num_tokens, 2 * inter]: gate, then up
    input_scale: torch.Tensor | None,
    scale_ub: float,
) -> Fp8Activation:
    """ops.silu_and_mul's result, quantized: [num_tokens, inter] e4m3 rows."""
    if x.is_cuda:
        from kernels.silu_mul import silu_and_mul_fp8

        q, scale = silu_and_mul_fp8(x, input_scale, scale_ub)
    else:
        q, scale = silu_and_mul_fp8_ref(x, input_scale, scale_ub)
    return Fp8Activation(q, scale, x.dtype)
