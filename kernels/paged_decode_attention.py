# One query token per sequence attending to its whole paged context (the decode step).
#   q:               [num_seqs, num_heads, head_dim]
#   k_cache/v_cache: [num_blocks, block_size, num_kv_heads, head_dim]; the current token's K/V
#                    already stored
#   block_tables:    [num_seqs, max_blocks_per_seq] int32
#   seq_lens:        [num_seqs] int32, keys per sequence including the current token; a padded
#                    CUDA-graph row has seq_len 0 and its output is ignored (must not fault)
import torch


def paged_decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q)
    max_len = int(seq_lens.max().item()) if num_seqs else 0
    if max_len == 0:
        out.zero_()
        return out
    num_blocks = (max_len + block_size - 1) // block_size
    blocks = block_tables[:, :num_blocks].long()
    # k, v: [num_seqs, num_blocks * block_size, num_kv_heads, head_dim]
    k = k_cache[blocks].flatten(1, 2).float()
    v = v_cache[blocks].flatten(1, 2).float()
    # qg: [num_seqs, num_kv_heads, group, head_dim]
    qg = q.float().view(num_seqs, num_kv_heads, group, head_dim)
    scores = torch.einsum("bhgd,bthd->bhgt", qg, k) * scale
    pos = torch.arange(k.shape[1], device=q.device)
    mask = pos[None, :] >= seq_lens[:, None].long()  # [num_seqs, ctx]
    scores.masked_fill_(mask[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows with seq_len 0 → zeros
    o = torch.einsum("bhgt,bthd->bhgd", probs, v)
    out.copy_(o.reshape(num_seqs, num_heads, head_dim).to(out.dtype))
    return out
