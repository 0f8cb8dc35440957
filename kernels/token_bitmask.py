# Grammar masks (engine/sampling/grammar_mask.py) applied to the logits in place:
#   logits  [num_rows, vocab] float, any row stride
#   bitmask [n, words] int32, words * 32 >= vocab: bit b of word w set = token 32w + b allowed
#   row_ids [n] int32/int64: the logits row of bitmask row i (None: row i)
# → logits[row_ids[i], t] = -inf for every t < vocab whose bit is clear; every other logit is
# left as it is. One pass over the masked rows, nothing materialized: the torch twin unpacks the
# bits into an [n, words * 32] tensor and copies the rows out and back.
import torch
import triton
import triton.language as tl

from kernels._launch import FLOAT_DTYPES, INDEX_DTYPES, check_last_dim_contiguous, check_tensor


def apply_token_bitmask_ref(
    logits: torch.Tensor, bitmask: torch.Tensor, row_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """Torch twin of apply_token_bitmask (in place; returns logits)."""
    vocab = logits.shape[1]
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    # [n, words, 32] flags → [n, words * 32] → the first `vocab` ids
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).flatten(1)[:, :vocab]
    if row_ids is None:
        rows = logits[: bitmask.shape[0]]
        rows.masked_fill_(allowed == 0, float("-inf"))
    else:
        rows = logits.index_select(0, row_ids)
        logits.index_copy_(0, row_ids, rows.masked_fill(allowed == 0, float("-inf")))
    return logits


# Sizes and strides are not specialized on: the engine warms the kernel up at start-up (one
# variant per logits dtype and row-id use), and a grammar's vocabulary may be one id wider.
@triton.jit(do_not_specialize=["vocab", "stride_logits_row", "stride_bitmask_row"])
def _apply_token_bitmask_kernel(
    logits_ptr,  # [num_rows, vocab]
    bitmask_ptr,  # [n, words] int32
    row_ids_ptr,  # [n] (unused without HAS_ROW_IDS)
    vocab,
    stride_logits_row,
    stride_bitmask_row,
    HAS_ROW_IDS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # program (bitmask row, token tile)
    i = tl.program_id(0).to(tl.int64)
    if HAS_ROW_IDS:
        row = tl.load(row_ids_ptr + i).to(tl.int64)
    else:
        row = i
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK] token ids
    in_vocab = offs < vocab
    words = tl.load(bitmask_ptr + i * stride_bitmask_row + offs // 32, mask=in_vocab, other=-1)
    banned = ((words >> (offs % 32)) & 1) == 0  # the arithmetic shift's sign bits never reach bit 0
    minus_inf = tl.full([BLOCK], float("-inf"), tl.float32).to(logits_ptr.dtype.element_ty)
    tl.store(logits_ptr + row * stride_logits_row + offs, minus_inf, mask=in_vocab & banned)


def apply_token_bitmask(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    row_ids: torch.Tensor | None = None,
    *,
    block: int = 4096,
) -> torch.Tensor:
    """Triton twin of apply_token_bitmask_ref: logits masked in place (returned)."""
    check_tensor("logits", logits, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("bitmask", bitmask, ndim=2, dtypes=(torch.int32,), device=logits.device)
    check_last_dim_contiguous("logits", logits)
    check_last_dim_contiguous("bitmask", bitmask)
    n, words = bitmask.shape
    vocab = logits.shape[1]
    if words * 32 < vocab:
        raise ValueError(f"bitmask has {words} words per row: fewer than {vocab} tokens' bits")
    if row_ids is not None:
        check_tensor("row_ids", row_ids, ndim=1, dtypes=INDEX_DTYPES, device=logits.device)
        if row_ids.shape[0] != n or not row_ids.is_contiguous():
            raise ValueError(f"row_ids must be contiguous [{n}] (one per bitmask row)")
    elif n > logits.shape[0]:
        raise ValueError(f"{n} bitmask rows but only {logits.shape[0]} logits rows")
    if n == 0 or vocab == 0:
        return logits
    grid = (n, triton.cdiv(vocab, block))
    _apply_token_bitmask_kernel[grid](
        logits, bitmask, row_ids if row_ids is not None else bitmask, vocab,
        logits.stride(0), bitmask.stride(0),
        HAS_ROW_IDS=row_ids is not None, BLOCK=block,
    )  # fmt: skip
    return logits
