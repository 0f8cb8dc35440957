# Rotary position embedding, neox layout (rotate_half: the first and second halves of each
# head form the pairs), applied in place to q and k.
#   q: [num_tokens, num_heads, head_dim]; k: [num_tokens, num_kv_heads, head_dim]
#   positions: [num_tokens] int64
#   cos_sin_cache: [max_position, head_dim] float32, cos in [:, :head_dim//2], sin in the rest
import torch


def apply_rotary_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    half = cos_sin_cache.shape[1] // 2
    cs = cos_sin_cache[positions]  # [num_tokens, head_dim]
    cos = cs[:, None, :half]
    sin = cs[:, None, half:]
    for t in (q, k):
        x1 = t[..., :half].float()
        x2 = t[..., half:].float()
        rot = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        t.copy_(rot.to(t.dtype))
    return q, k
