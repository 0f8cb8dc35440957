# SiLU-and-mul of the fused gate/up projection.
#   x: [num_tokens, 2 * intermediate] (gate first, then up) → [num_tokens, intermediate]
import torch
import torch.nn.functional as F


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
