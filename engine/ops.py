# Elementwise ops with two paths: the Triton kernel on CUDA tensors, the torch reference twin
# elsewhere. A test proves the two agree (tests/engine/test_gpu_paths.py).
from __future__ import annotations

import torch

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
