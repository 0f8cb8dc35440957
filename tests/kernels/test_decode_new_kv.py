# The decode kernel with new_kv (a decode-only step: rotary, the cache write of this token's k/v
# and attention in one launch) against the references run in turn (rotary_store_kv_ref, then
# paged_decode_attention_ref). The caches start random everywhere, the new token's slot
# included, so a kernel that reads that slot instead of the in-register k/v, or forgets to write
# it, fails. Tolerances: kernel_test_utils.TOL; outputs pre-filled with NaN.
import pytest
import torch

from kernels.paged_decode_attention import (
    NewKV,
    paged_decode_attention,
    paged_decode_attention_new_kv_ref,
)
from tests.kernels.kernel_test_utils import (
    assert_close,
    gen,
    int_tensor,
    nan_like,
    paged_kv,
    randn,
)
from tests.kernels.test_rotary_store_kv import _cos_sin


def _case(seq_lens, *, num_heads, num_kv_heads, head_dim, block_size, dtype, num_splits, seed,
          position_offset=0):  # fmt: skip
    g = gen(seed)
    k_cache, v_cache, tables = paged_kv(
        seq_lens, num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size,
        dtype=dtype, g=g,
    )  # fmt: skip
    n = len(seq_lens)
    q = randn(n, num_heads, head_dim, g=g, dtype=dtype)
    k = randn(n, num_kv_heads, head_dim, g=g, dtype=dtype)
    v = randn(n, num_kv_heads, head_dim, g=g, dtype=dtype)
    slots, positions = [], []
    for i, length in enumerate(seq_lens):
        last = length - 1
        if length == 0:  # CUDA-graph padding: nothing stored
            slots.append(-1)
            positions.append(0)
            continue
        slots.append(int(tables[i, last // block_size]) * block_size + last % block_size)
        positions.append(last + position_offset)
    new = NewKV(k, v, int_tensor(positions, torch.int64), _cos_sin(512, head_dim),
                int_tensor(slots, torch.int64))  # fmt: skip
    lens = int_tensor(seq_lens)
    scale = head_dim**-0.5
    kc_ref, vc_ref = k_cache.clone(), v_cache.clone()
    ref = paged_decode_attention_new_kv_ref(q, kc_ref, vc_ref, tables, lens, scale, new)
    q0, k0 = q.clone(), k.clone()
    out = nan_like(q)
    ret = paged_decode_attention(
        q, k_cache, v_cache, tables, lens, scale, max_seq_len=max(seq_lens),
        num_splits=num_splits, out=out, new_kv=new,
    )  # fmt: skip
    assert ret is out and not out.isnan().any()
    assert_close(out, ref, dtype)
    assert_close(k_cache, kc_ref, dtype)  # the new keys, rotated, at their slots
    assert torch.equal(v_cache, vc_ref)  # values stored as they came
    assert torch.equal(q, q0) and torch.equal(k, k0)  # inputs left as they were


# (dtype, num_heads, num_kv_heads, head_dim, block_size, seq_lens, num_splits)
CASES = [
    # one key (only the new token), block boundaries, padding, several splits
    (torch.float32, 4, 4, 64, 16, [1, 15, 16, 17, 0, 48], 1),
    (torch.float32, 8, 2, 128, 16, [100, 1, 33, 64, 65], 3),
    # 7 splits of 16-key ranges: the new token alone in the last non-empty one for some rows
    (torch.float32, 8, 1, 64, 8, [7, 8, 9, 97, 0, 113], 7),
    (torch.bfloat16, 8, 2, 128, 16, [31, 32, 90, 1], 2),
    (torch.float16, 16, 2, 64, 32, [64, 1, 65, 0], 1),
]


@pytest.mark.parametrize(
    ("dtype", "num_heads", "num_kv_heads", "head_dim", "block_size", "seq_lens", "num_splits"),
    CASES,
    ids=[f"{str(c[0])[6:]}-h{c[1]}kv{c[2]}-d{c[3]}-bs{c[4]}-s{c[6]}" for c in CASES],
)
def test_decode_new_kv_matches_references(
    dtype, num_heads, num_kv_heads, head_dim, block_size, seq_lens, num_splits
):
    _case(seq_lens, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
          block_size=block_size, dtype=dtype, num_splits=num_splits,
          seed=sum(seq_lens) + num_heads)  # fmt: skip


def test_decode_new_kv_rotates_at_the_given_position():
    # positions that are not seq_len - 1 (the kernel takes them from the tensor, not the length)
    _case([20, 40], num_heads=4, num_kv_heads=2, head_dim=64, block_size=16,
          dtype=torch.float32, num_splits=2, seed=3, position_offset=100)  # fmt: skip


@pytest.mark.parametrize("case", ["fp8_cache", "k_shape", "cos_sin_width", "positions_len"])
def test_decode_new_kv_rejects_bad_input(case):
    g = gen(4)
    k_cache, v_cache, tables = paged_kv(
        [5, 9], num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.float32, g=g
    )
    q = randn(2, 4, 64, g=g)
    k, v = randn(2, 2, 64, g=g), randn(2, 2, 64, g=g)
    pos, slots, cs = (
        int_tensor([4, 8], torch.int64),
        int_tensor([0, 1], torch.int64),
        _cos_sin(32, 64),
    )
    if case == "fp8_cache":
        k_cache, v_cache = (c.to(torch.float8_e4m3fn) for c in (k_cache, v_cache))
    elif case == "k_shape":
        k = randn(2, 1, 64, g=g)
    elif case == "cos_sin_width":
        cs = _cos_sin(32, 32)
    elif case == "positions_len":
        pos = int_tensor([4], torch.int64)
    with pytest.raises(ValueError):
        paged_decode_attention(
            q, k_cache, v_cache, tables, int_tensor([5, 9]), 0.125, max_seq_len=9,
            new_kv=NewKV(k, v, pos, cs, slots),
        )  # fmt: skip
