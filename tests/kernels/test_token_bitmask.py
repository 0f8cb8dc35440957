# apply_token_bitmask (Triton) against apply_token_bitmask_ref: the same logits, bit for bit
# (only -inf is written), with and without row ids, a vocabulary that ends mid-word and a
# bitmask one bit wider (a virtual EOS id), every bit of a word (the sign bit too).
import pytest
import torch

from kernels.token_bitmask import apply_token_bitmask, apply_token_bitmask_ref
from tests.kernels.kernel_test_utils import DEVICE, gen, randn


def random_bitmask(n: int, words: int, g: torch.Generator) -> torch.Tensor:
    bits = torch.randint(-(2**31), 2**31 - 1, (n, words), dtype=torch.int32, generator=g)
    return bits.to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("vocab", [77, 320, 5000])  # 77: a partial last word; 5000: two tiles
@pytest.mark.parametrize("with_row_ids", [False, True])
def test_apply_token_bitmask_matches_reference(dtype, vocab, with_row_ids):
    g = gen(vocab)
    logits = randn(6, vocab, g=g, dtype=dtype)
    words = (vocab + 1 + 31) // 32  # vocab + 1 bits: a virtual EOS id (a word more at 320)
    bitmask = random_bitmask(3, words, torch.Generator().manual_seed(vocab))
    bitmask[0, 0] = -(2**31)  # only the sign bit (token 31) allowed in the first word
    row_ids = torch.tensor([4, 0, 2], device=DEVICE) if with_row_ids else None
    expected = apply_token_bitmask_ref(logits.clone(), bitmask, row_ids)
    got = apply_token_bitmask(logits, bitmask, row_ids, block=256)
    assert got is logits
    assert torch.equal(got, expected)
    untouched = [1, 3, 5] if with_row_ids else [3, 4, 5]
    assert torch.isfinite(got[untouched]).all()
    assert got.isinf().any()


def test_apply_token_bitmask_strided_logits_and_int32_row_ids():
    g = gen(9)
    buf = randn(4, 200, g=g)
    logits = buf[:, :100]  # row stride 200
    bitmask = random_bitmask(2, 4, torch.Generator().manual_seed(1))
    row_ids = torch.tensor([3, 1], dtype=torch.int32, device=DEVICE)
    expected = apply_token_bitmask_ref(logits.clone(), bitmask, row_ids.long())
    apply_token_bitmask(logits, bitmask, row_ids, block=64)
    assert torch.equal(logits, expected)
    assert torch.isfinite(buf[:, 100:]).all()  # nothing written past the view


def test_apply_token_bitmask_empty():
    logits = torch.zeros(2, 40, device=DEVICE)
    apply_token_bitmask(logits, torch.zeros(0, 2, dtype=torch.int32, device=DEVICE))
    assert (logits == 0).all()


@pytest.mark.parametrize("case", ["narrow_bitmask", "row_ids_length", "too_many_rows", "int64"])
def test_apply_token_bitmask_rejects_bad_inputs(case):
    logits = torch.zeros(2, 64, device=DEVICE)
    bitmask = torch.zeros(2, 2, dtype=torch.int32, device=DEVICE)
    row_ids = None
    if case == "narrow_bitmask":
        bitmask = torch.zeros(2, 1, dtype=torch.int32, device=DEVICE)
    elif case == "row_ids_length":
        row_ids = torch.tensor([0], device=DEVICE)
    elif case == "too_many_rows":
        bitmask = torch.zeros(3, 2, dtype=torch.int32, device=DEVICE)
    else:
        bitmask = bitmask.long()
    with pytest.raises(ValueError):
        apply_token_bitmask(logits, bitmask, row_ids)
