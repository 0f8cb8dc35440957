# A tile of keys or values read from the paged KV cache, as the decode kernels walk it
# (kernels/paged_decode_attention.py, kernels/paged_decode_walks.py): which cache slots a run of
# key positions lives in, and the [BLOCK_N, HEAD_DIM] tile at those slots in the dots' dtype.
import triton
import triton.language as tl


@triton.jit
def key_slots(bt_row_ptr, offs_tok, end, BLOCK_SIZE: tl.constexpr):
    """Key positions offs_tok [BLOCK_N] of a block-table row → (tok_mask: < end, block_ids int64,
    slot_offs: offset within the block). Masked so entries past the range are never read."""
    tok_mask = offs_tok < end
    block_ids = tl.load(bt_row_ptr + offs_tok // BLOCK_SIZE, mask=tok_mask, other=0)
    block_ids = block_ids.to(tl.int64)  # int64: block * stride overflows int32 on big caches
    return tok_mask, block_ids, offs_tok % BLOCK_SIZE


@triton.jit
def load_kv_tile(
    cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    head_off,  # kv_head * the cache's head stride
    block_ids,  # [BLOCK_N] int64
    slot_offs,  # [BLOCK_N]
    tok_mask,  # [BLOCK_N]
    stride_block,
    stride_slot,
    like,  # a tensor in the dots' dtype (an e4m3 tile is widened to it)
    HEAD_DIM: tl.constexpr,
    KV_FP8: tl.constexpr,
    UPCAST_DOT: tl.constexpr,  # interpreter only: float32 (numpy has no bf16)
):
    """cache[block_ids, slot_offs, kv_head, :] → [BLOCK_N, HEAD_DIM]; masked keys are zeros."""
    offs_d = tl.arange(0, HEAD_DIM)
    ptrs = (
        cache_ptr
        + block_ids[:, None] * stride_block
        + slot_offs[:, None] * stride_slot
        + head_off
        + offs_d[None, :]
    )
    tile = tl.load(ptrs, mask=tok_mask[:, None], other=0.0)
    if KV_FP8:
        tile = tile.to(like.dtype)
    if UPCAST_DOT:
        tile = tile.to(tl.float32)
    return tile
