# Paged attention for one step's packed batch: rotary (when asked) and the cache write in one
# pass, then attention. The scheduler puts decodes (one query token) first; on CUDA they go to
# the split-KV decode kernel and the rest to a prefill kernel, on the CPU everything goes
# through the torch references. Prefill rows take the dense kernel, which reads each chunk's
# own keys from this step's k/v (a whole new prompt never touches the cache; a cached prefix,
# after a prefix hit or in a later chunk, is read through the block table); an FP8 cache keeps
# the paged extend kernel (the dense k/v are not the cache's rounded values).
# The metadata is all a backend needs, so kernels slot in here without the scheduler knowing.
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kernels.paged_prefill_attention import paged_prefill_attention_ref
from kernels.rotary import apply_rotary_ref
from kernels.store_kv import store_kv_ref

if TYPE_CHECKING:
    from kernels.shared_prefix_decode import PrefixGroups


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 for padding
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor  # [num_seqs] int32, keys after this step
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    num_decodes: int  # the first num_decodes sequences have exactly one query token
    max_query_len: int
    max_seq_len: int
    # The non-decode tail, re-based so its first query token is row 0.
    prefill_query_start_loc: torch.Tensor | None = None
    max_decode_seq_len: int = 0
    decode_num_splits: int | None = None  # fixed for CUDA-graph capture
    # [num_decodes] int32: the decode rows by context length, longest first (the decode
    # kernel starts its programs in this order, so its last wave is short rows); None: as is
    decode_order: torch.Tensor | None = None
    # Decode rows sharing prefix blocks (EngineConfig.shared_prefix_decode; used on CUDA, the
    # CPU references ignore it): their prefix is read once per group, then decode_num_splits
    # covers each row's suffix and decode_prefix_splits each group's prefix. None: plain.
    decode_prefix_groups: PrefixGroups | None = None
    decode_prefix_splits: int = 1
    # Key ranges of the prompt chunks' attention (EngineConfig.prefill_split_keys); > 1 takes
    # the paged kernel whatever the cache's dtype, its reduce merging the ranges
    prefill_num_splits: int = 1


def prefill_tail(meta: AttentionMetadata) -> AttentionMetadata:
    """The metadata of the batch's non-decode sequences alone (their tokens follow the
    num_decodes single-token decodes), for running a model over just those."""
    nd = meta.num_decodes
    return AttentionMetadata(
        slot_mapping=meta.slot_mapping[nd:],
        block_tables=meta.block_tables[nd:],
        seq_lens=meta.seq_lens[nd:],
        query_start_loc=meta.prefill_query_start_loc,
        num_decodes=0,
        max_query_len=meta.max_query_len,
        max_seq_len=meta.max_seq_len,
        prefill_query_start_loc=meta.prefill_query_start_loc,
    )


def paged_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    k_scale: float = 1.0,  # an FP8 cache holds K / k_scale and V / v_scale
    v_scale: float = 1.0,
    out: torch.Tensor | None = None,  # [num_tokens, num_heads, head_dim]; default: a new one
    # (positions [num_tokens], cos_sin [max_position, head_dim]): q and k are rotated here, in
    # place, by the kernel that writes the cache (one launch instead of two); None: they come
    # rotated.
    rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    if not q.is_cuda:
        if rotary is not None:
            apply_rotary_ref(q, k, *rotary)
        store_kv_ref(k, v, k_cache, v_cache, meta.slot_mapping, k_scale, v_scale)
        return paged_prefill_attention_ref(
            q, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc,
            meta.max_query_len, scale, out=out, k_scale=k_scale, v_scale=v_scale,
        )  # fmt: skip

    from kernels.dense_prefill_attention import dense_prefill_attention
    from kernels.paged_decode_attention import paged_decode_attention
    from kernels.paged_prefill_attention import paged_prefill_attention
    from kernels.rotary_store_kv import rotary_store_kv
    from kernels.store_kv import store_kv

    if rotary is not None:
        positions, cos_sin = rotary
        rotary_store_kv(
            q, k, v, positions, cos_sin, k_cache, v_cache, meta.slot_mapping, k_scale, v_scale
        )
    else:
        store_kv(k, v, k_cache, v_cache, meta.slot_mapping, k_scale, v_scale)
    if out is None:
        out = torch.empty_like(q)
    nd = meta.num_decodes
    num_seqs = meta.seq_lens.shape[0]
    if nd and meta.decode_prefix_groups is not None:
        from kernels.shared_prefix_decode import shared_prefix_decode_attention

        shared_prefix_decode_attention(
            q[:nd], k_cache, v_cache, meta.block_tables[:nd], meta.seq_lens[:nd], scale,
            meta.decode_prefix_groups, max_seq_len=meta.max_decode_seq_len,
            num_splits=meta.decode_num_splits or 1, prefix_splits=meta.decode_prefix_splits,
            out=out[:nd], k_scale=k_scale, v_scale=v_scale, seq_order=meta.decode_order,
        )  # fmt: skip
    elif nd:
        paged_decode_attention(
            q[:nd], k_cache, v_cache, meta.block_tables[:nd], meta.seq_lens[:nd], scale,
            max_seq_len=meta.max_decode_seq_len, num_splits=meta.decode_num_splits, out=out[:nd],
            k_scale=k_scale, v_scale=v_scale, seq_order=meta.decode_order,
        )  # fmt: skip
    if nd < num_seqs and k_cache.dtype == q.dtype and meta.prefill_num_splits == 1:
        dense_prefill_attention(
            q[nd:], k[nd:], v[nd:], k_cache, v_cache, meta.block_tables[nd:], meta.seq_lens[nd:],
            meta.prefill_query_start_loc, meta.max_query_len, scale, out=out[nd:],
        )  # fmt: skip
    elif nd < num_seqs:
        paged_prefill_attention(
            q[nd:], k_cache, v_cache, meta.block_tables[nd:], meta.seq_lens[nd:],
            meta.prefill_query_start_loc, meta.max_query_len, scale, out=out[nd:],
            k_scale=k_scale, v_scale=v_scale, num_splits=meta.prefill_num_splits,
        )  # fmt: skip
    return out
