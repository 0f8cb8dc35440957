# Elementwise ops with two paths: the Triton kernel on CUDA tensors, the torch reference twin
# elsewhere. A test proves the two agree (tests/engine/test_gpu_paths.py).
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.rms_norm import rms_norm_ref
from kernels.silu_mul import silu_and_mul_ref


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    if x.is_cuda:
        from kernels.rms_norm import rms_norm as triton_rms_norm

        return triton_rms_norm(x, weight, eps, residual)
    return rms_norm_ref(x, weight, eps, residual)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if x.is_cuda:
        from kernels.silu_mul import silu_and_mul as triton_silu_and_mul

        return triton_silu_and_mul(x)
    return silu_and_mul_ref(x)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight^T (+ bias). A decode step's few rows on a Hopper GPU take the split-K Triton
    GEMM (kernels/skinny_gemm.py, faster than cuBLAS there); everything else takes F.linear."""
    if x.is_cuda and bias is None:
        from kernels.skinny_gemm import skinny_config, skinny_gemm

        config = skinny_config(x, weight)
        if config is not None:
            return skinny_gemm(x, weight, config=config)
    return F.linear(x, weight, bias)
