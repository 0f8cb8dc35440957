# Causal attention of a packed batch of query chunks over the paged KV cache ("extend"/prefill).
#   q:               [num_tokens, num_heads, head_dim], sequences packed back to back
#   k_cache/v_cache: [num_blocks, block_size, num_kv_heads, head_dim]; the chunk's own K/V are
#                    already stored (store_kv runs first)
#   block_tables:    [num_seqs, max_blocks_per_seq] int32
#   seq_lens:        [num_seqs] int32, keys of each sequence after this step (cached + chunk)
#   query_start_loc: [num_seqs + 1] int32, cumulative query lengths
# Query j of sequence i (0-based in its chunk) sits at position seq_len - q_len + j and sees
# keys 0 ..= that position. Decode is the q_len == 1 case; speculative verification is q_len > 1.
import torch


def paged_prefill_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    num_heads = q.shape[1]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for i, seq_len in enumerate(lens):
        q_start, q_end = starts[i], starts[i + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        num_blocks = (seq_len + block_size - 1) // block_size
        blocks = block_tables[i, :num_blocks].long()
        # k, v: [seq_len, num_kv_heads, head_dim] → [num_heads, seq_len, head_dim]
        k = k_cache[blocks].flatten(0, 1)[:seq_len].float()
        v = v_cache[blocks].flatten(0, 1)[:seq_len].float()
        k = k.repeat_interleave(group, dim=1).transpose(0, 1)
        v = v.repeat_interleave(group, dim=1).transpose(0, 1)
        qi = q[q_start:q_end].float().transpose(0, 1)  # [num_heads, q_len, head_dim]
        scores = torch.matmul(qi, k.transpose(1, 2)) * scale  # [num_heads, q_len, seq_len]
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        k_pos = torch.arange(seq_len, device=q.device)
        mask = k_pos[None, :] > q_pos[:, None]
        scores.masked_fill_(mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[q_start:q_end] = torch.matmul(probs, v).transpose(0, 1).to(out.dtype)
    return out
