# RMSNorm, optionally fused with the residual add that precedes it.
#   x, residual: [num_tokens, hidden]; weight: [hidden]
# With a residual: s = x + residual; returns (rms_norm(s) * weight, s). Without: rms_norm(x) * weight.
# Statistics in float32, output in x's dtype (as HF Llama does).
import torch


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
