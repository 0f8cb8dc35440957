# Write new K/V rows into the paged cache through a slot mapping.
#   key, value:      [num_tokens, num_kv_heads, head_dim]
#   k_cache/v_cache: [num_blocks, block_size, num_kv_heads, head_dim]
#   slot_mapping:    [num_tokens] int64, slot = block_id * block_size + offset; slot < 0 = skip
# (padding tokens of a CUDA-graph batch carry slot -1).
import torch


def store_kv_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    k_flat = k_cache.view(-1, *k_cache.shape[2:])
    v_flat = v_cache.view(-1, *v_cache.shape[2:])
    k_flat[slots] = key[valid].to(k_cache.dtype)
    v_flat[slots] = value[valid].to(v_cache.dtype)
