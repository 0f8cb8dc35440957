# shared_prefix_decode_attention (prefix kernel + suffix split kernel + reduce) against
# paged_decode_attention_ref on caches whose grouped rows really share their leading blocks,
# and its torch twin. Outputs are pre-filled with NaN, so an element never written fails.
import pytest
import torch

from kernels.fp8_quant import FP8_DTYPE
from kernels.paged_decode_attention import paged_decode_attention_ref
from kernels.shared_prefix_decode import (
    PrefixGroups,
    shared_prefix_decode_attention,
    shared_prefix_decode_attention_ref,
)
from tests.kernels.kernel_test_utils import (
    DEVICE,
    K_SCALE,
    V_SCALE,
    assert_close,
    fp8_kv,
    gen,
    int_tensor,
    nan_like,
    paged_kv,
    randn,
)

# every test once per walk of the suffix pass's split kernel (conftest.py: decode_walk)
pytestmark = pytest.mark.usefixtures("decode_walk")


def _shared_case(seq_lens, groups, *, num_kv_heads, head_dim, block_size, cache_dtype, g):
    """Caches where each group's rows use their first row's blocks for the first
    ceil(prefix_len / block_size) blocks. groups: [(rows, prefix_len)]."""
    k, v, tables = paged_kv(
        seq_lens, num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size,
        dtype=torch.float32 if cache_dtype == FP8_DTYPE else cache_dtype, g=g,
    )  # fmt: skip
    for rows, prefix_len in groups:
        shared = -(-prefix_len // block_size)
        for r in rows[1:]:
            tables[r, :shared] = tables[rows[0], :shared]
    if cache_dtype == FP8_DTYPE:
        k, v = fp8_kv(k, v)
    return k, v, tables


def _groups(num_seqs, groups, *, max_rows, num_groups):
    rows = torch.full((num_groups, max_rows), -1, dtype=torch.int32)
    prefix_lens = torch.zeros(num_groups, dtype=torch.int32)
    key_start = torch.zeros(num_seqs, dtype=torch.int32)
    for i, (members, prefix_len) in enumerate(groups):
        rows[i, : len(members)] = torch.tensor(members, dtype=torch.int32)
        prefix_lens[i] = prefix_len
        key_start[members] = prefix_len
    return PrefixGroups(rows.to(DEVICE), prefix_lens.to(DEVICE), key_start.to(DEVICE))


# (seq_lens, groups [(rows, prefix_len)], num_heads, num_kv_heads, num_splits, prefix_splits)
CASES = [
    # no sharing at all: only the suffix pass (padding groups, every prefix slot empty)
    ([40, 17, 0, 5], [], 8, 2, 1, 1),
    # every row shares 32 keys (two whole blocks); GQA 4; suffix split in 2
    ([50, 33, 64, 40], [([0, 1, 2, 3], 32)], 8, 2, 2, 1),
    # several groups and a row in none; a prefix ending inside a block (20 of 16-key blocks)
    ([70, 45, 21, 90, 30, 0], [([0, 3], 48), ([1, 2, 4], 20)], 8, 1, 1, 2),
    # GQA 8, a prefix that is a row's whole context but its last key, more prefix splits than
    # tiles, a seq_len 0 padding row
    ([33, 80, 0, 100], [([1, 0, 3], 32)], 16, 2, 3, 4),
]


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16, FP8_DTYPE])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_shared_prefix_decode_matches_plain_attention(case, cache_dtype):
    seq_lens, groups, num_heads, num_kv_heads, num_splits, prefix_splits = CASES[case]
    dtype = torch.bfloat16 if cache_dtype == FP8_DTYPE else cache_dtype
    g = gen(100 + case)
    head_dim, block_size = 64, 16
    k, v, tables = _shared_case(
        seq_lens, groups, num_kv_heads=num_kv_heads, head_dim=head_dim,
        block_size=block_size, cache_dtype=cache_dtype, g=g,
    )  # fmt: skip
    q = randn(len(seq_lens), num_heads, head_dim, g=g, dtype=dtype)
    lens = int_tensor(seq_lens)
    pg = _groups(len(seq_lens), groups, max_rows=4, num_groups=3)
    scales = {"k_scale": K_SCALE, "v_scale": V_SCALE}
    out = shared_prefix_decode_attention(
        q, k, v, tables, lens, 0.125, pg, max_seq_len=max(seq_lens), num_splits=num_splits,
        prefix_splits=prefix_splits, out=nan_like(q), **scales,
    )  # fmt: skip
    ref = paged_decode_attention_ref(q, k, v, tables, lens, 0.125, **scales)
    twin = shared_prefix_decode_attention_ref(q, k, v, tables, lens, 0.125, pg, **scales)
    assert not out.isnan().any(), "some output elements were never written"
    assert_close(out, ref, dtype)
    torch.testing.assert_close(twin, ref, rtol=1e-5, atol=1e-5)


def test_prefix_is_read_through_the_first_rows_table():
    # Rows 1 and 2 name different blocks for their first 16 keys than row 0; grouped, they read
    # row 0's: the result is the twin's, not plain attention over their own tables.
    g = gen(7)
    seq_lens = [40, 40, 40]
    k, v, tables = paged_kv(
        seq_lens, num_kv_heads=1, head_dim=32, block_size=16, dtype=torch.float32, g=g
    )
    q = randn(3, 4, 32, g=g)
    lens = int_tensor(seq_lens)
    pg = _groups(3, [([0, 1, 2], 16)], max_rows=3, num_groups=1)
    out = shared_prefix_decode_attention(
        q, k, v, tables, lens, 0.2, pg, max_seq_len=40, out=nan_like(q)
    )
    twin = shared_prefix_decode_attention_ref(q, k, v, tables, lens, 0.2, pg)
    plain = paged_decode_attention_ref(q, k, v, tables, lens, 0.2)
    assert_close(out, twin, torch.float32)
    assert_close(out[0], plain[0], torch.float32)
    assert not torch.allclose(out[1:], plain[1:], atol=1e-3)


def test_group_of_one_row_and_rows_beyond_eight():
    # 12 rows of one prefix in groups of at most 8 (M side 8 x 2 = 16 and 4 x 2 = 8 -> 16)
    g = gen(9)
    seq_lens = [64 + 3 * i for i in range(12)]
    groups = [(list(range(8)), 48), (list(range(8, 12)), 48)]
    k, v, tables = _shared_case(
        seq_lens, [(list(range(12)), 48)], num_kv_heads=2, head_dim=32, block_size=16,
        cache_dtype=torch.float32, g=g,
    )  # fmt: skip
    q = randn(12, 4, 32, g=g)
    lens = int_tensor(seq_lens)
    pg = _groups(12, groups, max_rows=8, num_groups=2)
    out = shared_prefix_decode_attention(
        q, k, v, tables, lens, 0.2, pg, max_seq_len=max(seq_lens), num_splits=2, out=nan_like(q)
    )
    assert_close(out, paged_decode_attention_ref(q, k, v, tables, lens, 0.2), torch.float32)


def test_rejects_too_many_splits():
    g = gen(1)
    k, v, tables = paged_kv(
        [8], num_kv_heads=1, head_dim=16, block_size=8, dtype=torch.float32, g=g
    )
    q = randn(1, 1, 16, g=g)
    pg = _groups(1, [], max_rows=1, num_groups=1)
    with pytest.raises(ValueError, match="<= 256"):
        shared_prefix_decode_attention(
            q, k, v, tables, int_tensor([8]), 1.0, pg, max_seq_len=8, num_splits=200,
            prefix_splits=100,
        )  # fmt: skip


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, FP8_DTYPE])
def test_groups_found_from_block_tables_give_plain_attention(cache_dtype):
    # engine/core/prefix_groups.py's grouping of real shared tables, fed to the kernel as a fixed
    # bucket (more group slots than groups): same output as attention over each row's table.
    from engine.core.prefix_groups import find_prefix_groups

    g = gen(11)
    seq_lens = [90, 70, 0, 81, 66, 35, 100, 50]
    shared = [([0, 3, 6], 64), ([1, 4, 7], 48)]  # row 5 shares with none, row 2 is padding
    k, v, tables = _shared_case(
        seq_lens, shared, num_kv_heads=2, head_dim=32, block_size=16, cache_dtype=cache_dtype,
        g=g,
    )  # fmt: skip
    found = find_prefix_groups(
        tables.cpu().numpy(), torch.tensor(seq_lens).numpy(), 16,
        min_blocks=2, max_blocks=64, max_groups=4, max_rows=2,
    )  # fmt: skip
    assert found.num_grouped_rows == 4  # chunks of 2 rows: one row of each prefix left out
    pg = PrefixGroups.from_host(found.rows, found.prefix_lens, found.key_start, DEVICE)
    q = randn(len(seq_lens), 16, 32, g=g, dtype=torch.bfloat16)
    lens = int_tensor(seq_lens)
    scales = {"k_scale": K_SCALE, "v_scale": V_SCALE}
    out = shared_prefix_decode_attention(
        q, k, v, tables, lens, 0.2, pg, max_seq_len=100, num_splits=2, prefix_splits=2,
        out=nan_like(q), **scales,
    )  # fmt: skip
    ref = paged_decode_attention_ref(q, k, v, tables, lens, 0.2, **scales)
    assert_close(out, ref, torch.bfloat16)
