# Rotary position embedding, neox layout (rotate_half: the first and second halves of each
# head form the pairs), applied in place to q and k.
#   q: [num_tokens, num_heads, head_dim]; k: [num_tokens, num_kv_heads, head_dim]
#   positions: [num_tokens] int64
#   cos_sin_cache: [max_position, head_dim] float32, cos in [:, :head_dim//2], sin in the rest
import torch
import triton
import triton.language as tl

from kernels._launch import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_contiguous,
    check_last_dim_contiguous,
    check_launchable,
    check_shape,
    check_tensor,
    next_power_of_2,
)


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


# ---------------------------------------------------------------------------------------------
# Triton kernel. One program per token: it loads the token's cos/sin row once, then rotates the
# query heads and the key heads in tiles of [BLOCK_H, BLOCK_HALF] pairs (x1 = first half of a
# head, x2 = second half), in place. Each element is read and written by the same program.
# ---------------------------------------------------------------------------------------------
@triton.jit
def _rotate_heads(
    base_ptr,  # this token's row of q or k: [num_heads, head_dim] with head stride stride_head
    num_heads,
    stride_head,
    cos,  # [BLOCK_HALF] float32
    sin,  # [BLOCK_HALF] float32
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    offs_d = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF]
    for h0 in range(0, num_heads, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)  # [BLOCK_H]
        mask = (offs_h[:, None] < num_heads) & (offs_d[None, :] < HALF)  # [BLOCK_H, BLOCK_HALF]
        # x1 = t[tok, h, d], x2 = t[tok, h, HALF + d]
        x1_ptrs = base_ptr + offs_h[:, None] * stride_head + offs_d[None, :]
        x2_ptrs = x1_ptrs + HALF
        x1 = tl.load(x1_ptrs, mask=mask, other=0.0)
        x2 = tl.load(x2_ptrs, mask=mask, other=0.0)
        x1f = x1.to(tl.float32)
        x2f = x2.to(tl.float32)
        o1 = x1f * cos[None, :] - x2f * sin[None, :]
        o2 = x2f * cos[None, :] + x1f * sin[None, :]
        tl.store(x1_ptrs, o1.to(x1.dtype), mask=mask)
        tl.store(x2_ptrs, o2.to(x2.dtype), mask=mask)


@triton.jit(do_not_specialize_on_alignment=["positions_ptr"])
def _rotary_kernel(
    q_ptr,  # [num_tokens, num_heads, head_dim]
    k_ptr,  # [num_tokens, num_kv_heads, head_dim]
    positions_ptr,  # [num_tokens]
    cos_sin_ptr,  # [max_position, head_dim]: cos in [:, :HALF], sin in [:, HALF:]
    num_heads,
    num_kv_heads,
    stride_q_tok,
    stride_q_head,
    stride_k_tok,
    stride_k_head,
    stride_cs_pos,
    HALF: tl.constexpr,  # head_dim // 2
    BLOCK_HALF: tl.constexpr,  # HALF rounded up to a power of two
    BLOCK_H: tl.constexpr,  # heads per tile
):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + tok).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_HALF)
    d_mask = offs_d < HALF
    # cos_sin[pos, d] and cos_sin[pos, HALF + d]
    cos = tl.load(cos_sin_ptr + pos * stride_cs_pos + offs_d, mask=d_mask, other=0.0)
    sin = tl.load(cos_sin_ptr + pos * stride_cs_pos + HALF + offs_d, mask=d_mask, other=0.0)
    cos = cos.to(tl.float32)
    sin = sin.to(tl.float32)
    # q[tok] and k[tok]
    _rotate_heads(q_ptr + tok * stride_q_tok, num_heads, stride_q_head, cos, sin,
                  HALF, BLOCK_HALF, BLOCK_H)  # fmt: skip
    _rotate_heads(k_ptr + tok * stride_k_tok, num_kv_heads, stride_k_head, cos, sin,
                  HALF, BLOCK_HALF, BLOCK_H)  # fmt: skip


def check_rotary(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    """The rotary launchers' argument checks (this one and rotary_store_kv's)."""
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES)
    device = q.device
    check_tensor("k", k, ndim=3, dtypes=FLOAT_DTYPES, device=device)
    check_tensor("positions", positions, ndim=1, dtypes=INDEX_DTYPES, device=device)
    check_tensor("cos_sin_cache", cos_sin_cache, ndim=2, dtypes=FLOAT_DTYPES, device=device)
    num_tokens, _, head_dim = q.shape
    check_shape("k", k, (num_tokens, k.shape[1], head_dim))
    check_shape("positions", positions, (num_tokens,))
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for rotary, got {head_dim}")
    if cos_sin_cache.shape[1] != head_dim:
        raise ValueError(
            f"cos_sin_cache must be [max_position, head_dim={head_dim}] (full rotary), "
            f"got {tuple(cos_sin_cache.shape)}"
        )
    for name, t in (("q", q), ("k", k), ("cos_sin_cache", cos_sin_cache)):
        check_last_dim_contiguous(name, t)
    check_contiguous("positions", positions)


def rotary_tiles(head_dim: int, num_heads: int, num_kv_heads: int) -> tuple[int, int, int]:
    """(HALF, BLOCK_HALF, BLOCK_H): a program's tiles are [BLOCK_H heads, BLOCK_HALF pairs]."""
    half = head_dim // 2
    block_half = next_power_of_2(half)
    return half, block_half, min(next_power_of_2(max(num_heads, num_kv_heads)),
                                 max(1, 2048 // block_half))  # fmt: skip


def apply_rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of `apply_rotary_ref`: rotates q and k in place and returns them.

    q and k may be strided views (e.g. of a fused QKV output) as long as the last dim is
    contiguous, so callers need not copy. Positions are not range-checked (no host sync).
    """
    check_rotary(q, k, positions, cos_sin_cache)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    if num_tokens == 0:
        return q, k
    check_launchable(q)
    half, BLOCK_HALF, BLOCK_H = rotary_tiles(head_dim, num_heads, num_kv_heads)
    _rotary_kernel[(num_tokens,)](
        q,
        k,
        positions,
        cos_sin_cache,
        num_heads,
        num_kv_heads,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cos_sin_cache.stride(0),
        HALF=half,
        BLOCK_HALF=BLOCK_HALF,
        BLOCK_H=BLOCK_H,
        num_warps=4,
    )
    return q, k
