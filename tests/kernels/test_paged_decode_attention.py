# paged_decode_attention (Triton, split-KV, GQA) against paged_decode_attention_ref.
# Tolerances: kernel_test_utils.TOL (fp32 rtol 1e-4 / atol 1e-5, bf16 rtol 1.6e-2 / atol 1e-2).
# Every launch writes into an output pre-filled with NaN, so an element the kernel forgets to
# write fails the comparison.
import random

import pytest
import torch

from kernels.paged_decode_attention import (
    MAX_SPLITS,
    PROGRAMS_PER_SM,
    SPREAD_MIN_KEYS,
    SPREAD_WAVES,
    STRAGGLER_FACTOR,
    balanced_num_splits,
    choose_num_splits,
    paged_decode_attention,
    paged_decode_attention_ref,
    split_ladder,
)
from tests.kernels.kernel_test_utils import (
    DEVICE,
    assert_close,
    gen,
    int_tensor,
    nan_like,
    paged_kv,
    randn,
    requires_gpu,
)


def _run_case(seq_lens, *, num_heads, num_kv_heads, head_dim, block_size, dtype, num_splits, seed):
    g = gen(seed)
    k_cache, v_cache, block_tables = paged_kv(
        seq_lens,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        g=g,
    )
    q = randn(len(seq_lens), num_heads, head_dim, g=g, dtype=dtype)
    lens = int_tensor(seq_lens)
    scale = head_dim**-0.5
    out = nan_like(q)
    ret = paged_decode_attention(
        q,
        k_cache,
        v_cache,
        block_tables,
        lens,
        scale,
        max_seq_len=max(seq_lens),
        num_splits=num_splits,
        out=out,
    )
    assert ret is out
    ref = paged_decode_attention_ref(q, k_cache, v_cache, block_tables, lens, scale)
    assert not out.isnan().any(), "some output elements were never written"
    assert_close(out, ref, dtype)
    return out, ref


# (dtype, num_heads, num_kv_heads, head_dim, block_size, seq_lens, num_splits)
CASES = [
    # GQA ratio 1, block boundaries (k*bs - 1, k*bs, k*bs + 1), a one-token sequence, padding
    (torch.float32, 4, 4, 64, 16, [1, 15, 16, 17, 0, 48], 1),
    # GQA ratio 4, head_dim 128, several splits; very different lengths
    (torch.float32, 8, 2, 128, 16, [100, 1, 33, 64, 65], 3),
    # GQA ratio 8, block_size 8, more splits than key tiles (empty splits contribute nothing)
    (torch.float32, 8, 1, 64, 8, [7, 8, 9, 97, 0], 5),
    # bf16, head_dim 128 / 64, ratios 4 and 8
    (torch.bfloat16, 8, 2, 128, 16, [31, 32, 90, 1], 2),
    (torch.bfloat16, 16, 2, 64, 32, [64, 1, 65, 0], 1),
    # fp16, automatic split choice
    (torch.float16, 4, 1, 64, 16, [50, 3, 16], None),
]


@pytest.mark.parametrize(
    ("dtype", "num_heads", "num_kv_heads", "head_dim", "block_size", "seq_lens", "num_splits"),
    CASES,
    ids=[f"{str(c[0])[6:]}-h{c[1]}kv{c[2]}-d{c[3]}-bs{c[4]}-s{c[6]}" for c in CASES],
)
def test_decode_matches_reference(
    dtype, num_heads, num_kv_heads, head_dim, block_size, seq_lens, num_splits
):
    _run_case(
        seq_lens,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        num_splits=num_splits,
        seed=sum(seq_lens) + num_heads,
    )


def test_decode_split_counts_agree():
    # the same batch with 1, 2 and 7 splits (7 > key tiles for most rows) gives the same answer
    outs = [
        _run_case(
            [70, 5, 128, 129],
            num_heads=4,
            num_kv_heads=2,
            head_dim=64,
            block_size=16,
            dtype=torch.float32,
            num_splits=n,
            seed=11,
        )[0]
        for n in (1, 2, 7)
    ]
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(outs[2], outs[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_seq_order_changes_only_the_launch_order(num_splits):
    # programs taking the rows longest first (the engine's order) or in any permutation write
    # exactly what the identity order writes, every row included
    seq_lens = [70, 5, 0, 128, 129, 33]
    g = gen(21)
    k_cache, v_cache, block_tables = paged_kv(
        seq_lens, num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.float32, g=g
    )
    q = randn(len(seq_lens), 4, 64, g=g)
    lens = int_tensor(seq_lens)
    outs = []
    for order in (None, torch.argsort(lens, descending=True), torch.tensor([5, 0, 4, 1, 3, 2])):
        out = nan_like(q)
        kw = {} if order is None else {"seq_order": order.to(torch.int32).to(DEVICE)}
        paged_decode_attention(
            q, k_cache, v_cache, block_tables, lens, 0.125, max_seq_len=max(seq_lens),
            num_splits=num_splits, out=out, **kw,
        )  # fmt: skip
        assert not out.isnan().any()
        outs.append(out)
    ref = paged_decode_attention_ref(q, k_cache, v_cache, block_tables, lens, 0.125)
    assert_close(outs[0], ref, torch.float32)
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0)
    torch.testing.assert_close(outs[2], outs[0], rtol=0, atol=0)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_all_padding_rows(num_splits):
    # a CUDA-graph batch that is all padding: seq_len 0 everywhere, block tables all -1
    g = gen(12)
    k_cache, v_cache, _ = paged_kv(
        [16], num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.float32, g=g
    )
    block_tables = torch.full((3, 4), -1, dtype=torch.int32, device=DEVICE)
    q = randn(3, 4, 64, g=g)
    out = nan_like(q)
    lens = int_tensor([0, 0, 0])
    paged_decode_attention(
        q,
        k_cache,
        v_cache,
        block_tables,
        lens,
        0.125,
        max_seq_len=0,
        num_splits=num_splits,
        out=out,
    )
    assert torch.equal(out, torch.zeros_like(out))  # the reference gives zeros too


def test_decode_strided_views_and_int64_metadata():
    # q as a view of a fused qkv output, out as a view of a wider buffer, int64 metadata
    g = gen(13)
    seq_lens = [20, 3, 47]
    num_heads, num_kv_heads, head_dim = 4, 2, 64
    k_cache, v_cache, block_tables = paged_kv(
        seq_lens,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=16,
        dtype=torch.float32,
        g=g,
    )
    qkv = randn(3, num_heads + 2 * num_kv_heads, head_dim, g=g)
    q = qkv[:, :num_heads]
    out_buf = torch.full((3, num_heads + 1, head_dim), float("nan"), device=DEVICE)
    out = out_buf[:, 1:]
    lens = int_tensor(seq_lens, torch.int64)
    bt = block_tables.long()
    paged_decode_attention(
        q, k_cache, v_cache, bt, lens, 0.125, max_seq_len=47, num_splits=2, out=out
    )
    ref = paged_decode_attention_ref(q, k_cache, v_cache, bt, lens, 0.125)
    assert_close(out, ref, torch.float32)
    assert out_buf[:, 0].isnan().all(), "wrote outside the out view"


def test_decode_returns_new_tensor_without_out():
    g = gen(14)
    k_cache, v_cache, block_tables = paged_kv(
        [9, 30], num_kv_heads=1, head_dim=64, block_size=16, dtype=torch.float32, g=g
    )
    q = randn(2, 2, 64, g=g)
    lens = int_tensor([9, 30])
    out = paged_decode_attention(q, k_cache, v_cache, block_tables, lens, 0.1, max_seq_len=30)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert_close(
        out, paged_decode_attention_ref(q, k_cache, v_cache, block_tables, lens, 0.1), torch.float32
    )


def test_choose_num_splits():
    assert choose_num_splits(64, 8, 4096, 132) == 1  # 512 programs already fill the GPU
    assert choose_num_splits(1, 8, 16384, 132) == 33  # 2 programs per SM
    assert choose_num_splits(1, 8, 300, 132) == 2  # >= 256 keys per split
    assert choose_num_splits(4, 2, 0, 132) == 1
    assert choose_num_splits(1, 1, 1 << 20, 132) == 64  # capped


def test_balanced_num_splits_leaves_a_full_batch_unsplit():
    # nano's rows at batch 128 and 256 (uniform in [350, 1050] keys), launched longest first:
    # 1,024 programs already even out; splitting only adds ranges and a reduce (H200, batch 128:
    # 0.102 ms a layer unsplit, 0.110 at 2)
    rng = random.Random(0)
    for batch in (128, 256):
        rows = [rng.randint(350, 1050) for _ in range(batch)]
        ladder = split_ladder(batch, 8, 8192)
        assert balanced_num_splits(rows, 8, 132, candidates=ladder) == 1
    # a mid-size batch of long rows is spread over ~SPREAD_WAVES waves of programs, each range
    # keeping >= SPREAD_MIN_KEYS keys of a mean row
    chats = [2400] * 95
    s = balanced_num_splits(chats, 8, 132)
    assert 1 < s <= 2400 // SPREAD_MIN_KEYS
    assert 95 * 8 * s >= SPREAD_WAVES * PROGRAMS_PER_SM * 132 or s == 2400 // SPREAD_MIN_KEYS


def test_balanced_num_splits_cuts_a_straggler():
    chats = [2400] * 95
    # One 30k document among them: its ranges must be short beside every program slot's keys.
    s = balanced_num_splits([*chats, 30000], 8, 132)
    slot_keys = (sum(chats) + 30000) * 8 // (PROGRAMS_PER_SM * 132)
    assert -(-30000 // s) * STRAGGLER_FACTOR <= slot_keys
    # Captured counts: the smallest that reaches the need, else the largest.
    ladder = split_ladder(96, 8, 8192)
    assert ladder == [1, 2, 4, 8, 16]
    assert balanced_num_splits([*chats, 30000], 8, 132, candidates=ladder) == 16
    assert balanced_num_splits([*chats, 120000], 8, 132, candidates=ladder) == 16
    assert balanced_num_splits([*chats, 6000], 8, 132, candidates=ladder) == 4
    # Few rows: nothing to balance, never ranges under MIN_KEYS_PER_SPLIT keys.
    assert balanced_num_splits([300], 8, 132) == choose_num_splits(1, 8, 300, 132) == 2
    assert balanced_num_splits([], 8, 132) == 1
    assert balanced_num_splits([1 << 20], 1, 132) <= MAX_SPLITS


def test_split_ladder():
    assert split_ladder(96, 8, 8192) == [1, 2, 4, 8, 16]
    small = split_ladder(1, 8, 8192)
    assert small[0] == choose_num_splits(1, 8, 8192) and small == sorted(set(small))
    assert max(small) <= MAX_SPLITS
    assert split_ladder(4, 8, 300) == [2]  # never more splits than 256-key ranges


@pytest.mark.parametrize("block_h", [2, 4, None])
def test_decode_reduce_heads_per_program_agree(block_h, monkeypatch):
    # the reduce kernel combines one head, a few, or one GQA group per program: same result
    import kernels.paged_decode_attention as pda

    outs = []
    for h in (1, block_h):
        monkeypatch.setattr(pda, "REDUCE_BLOCK_H", h)
        lens = [70, 5, 128, 129, 0]
        shape = {"num_heads": 8, "num_kv_heads": 2, "head_dim": 64, "block_size": 16}
        outs.append(_run_case(lens, **shape, dtype=torch.float32, num_splits=3, seed=13)[0])
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-6, atol=1e-7)


def test_reduce_heads_per_program():
    from kernels.paged_decode_attention import REDUCE_MAX_ROWS, reduce_heads_per_program

    assert reduce_heads_per_program(32, 4, 4) == 4  # one GQA group
    assert reduce_heads_per_program(32, 4, 64) * 64 <= REDUCE_MAX_ROWS  # wide: fewer heads
    assert reduce_heads_per_program(6, 3, 2) == 4  # a power of two (masked past num_heads)
    assert reduce_heads_per_program(1, 1, 256) == 1


def _bad_decode_args(case):
    g = gen(15)
    k_cache, v_cache, block_tables = paged_kv(
        [10, 20], num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.float32, g=g
    )
    q = randn(2, 4, 64, g=g)
    lens = int_tensor([10, 20])
    kw = {"max_seq_len": 20, "num_splits": 2}
    if case == "q_ndim":
        q = q.view(2, 256)
    elif case == "heads_not_multiple":
        q = randn(2, 3, 64, g=g)
    elif case == "head_dim_mismatch":
        q = randn(2, 4, 32, g=g)
    elif case == "head_dim_not_pow2":
        q = randn(2, 4, 48, g=g)
        k_cache = randn(4, 16, 2, 48, g=g)
        v_cache = randn(4, 16, 2, 48, g=g)
    elif case == "dtype_mismatch":
        k_cache = k_cache.half()
    elif case == "v_shape":
        v_cache = v_cache[:, :8]
    elif case == "block_tables_dtype":
        block_tables = block_tables.float()
    elif case == "block_tables_rows":
        block_tables = block_tables[:1]
    elif case == "seq_lens_len":
        lens = lens[:1]
    elif case == "max_seq_len_too_big":
        kw["max_seq_len"] = 10_000
    elif case == "max_seq_len_not_int":
        kw["max_seq_len"] = lens.max()
    elif case == "num_splits_zero":
        kw["num_splits"] = 0
    elif case == "num_splits_too_many":
        kw["num_splits"] = 257
    elif case == "out_shape":
        kw["out"] = torch.empty(2, 4, 32, device=DEVICE)
    elif case == "out_dtype":
        kw["out"] = torch.empty(2, 4, 64, device=DEVICE, dtype=torch.float16)
    elif case == "q_last_dim_stride":
        q = randn(2, 4, 128, g=g)[..., ::2]
    elif case == "seq_order_dtype":
        kw["seq_order"] = torch.tensor([1, 0], device=DEVICE)  # int64
    elif case == "seq_order_len":
        kw["seq_order"] = torch.tensor([1, 0, 2], dtype=torch.int32, device=DEVICE)
    return (q, k_cache, v_cache, block_tables, lens, 0.125), kw


@pytest.mark.parametrize(
    "case",
    [
        "q_ndim",
        "heads_not_multiple",
        "head_dim_mismatch",
        "head_dim_not_pow2",
        "dtype_mismatch",
        "v_shape",
        "block_tables_dtype",
        "block_tables_rows",
        "seq_lens_len",
        "max_seq_len_too_big",
        "max_seq_len_not_int",
        "num_splits_zero",
        "num_splits_too_many",
        "out_shape",
        "out_dtype",
        "q_last_dim_stride",
        "seq_order_dtype",
        "seq_order_len",
    ],
)
def test_decode_rejects_bad_inputs(case):
    args, kw = _bad_decode_args(case)
    with pytest.raises(ValueError):
        paged_decode_attention(*args, **kw)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("num_splits", [None, 1, 8])
def test_decode_gpu_bf16_realistic(num_splits):
    # real bf16 tensor-core dots on the GPU, 32 q heads / 8 kv heads, long uneven contexts
    seq_lens = [1, 16, 17, 511, 512, 513, 2000, 4096, 0, 3001]
    _run_case(
        seq_lens,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=16,
        dtype=torch.bfloat16,
        num_splits=num_splits,
        seed=16,
    )


@pytest.mark.gpu
@requires_gpu
def test_decode_cuda_graph_replay():
    # capture once with a fixed num_splits, replay with new lengths/tables/queries in place
    g = gen(17)
    seq_lens = [300, 5, 77, 0]
    k_cache, v_cache, block_tables = paged_kv(
        [512] * 4, num_kv_heads=2, head_dim=128, block_size=16, dtype=torch.bfloat16, g=g
    )
    q = randn(4, 8, 128, g=g, dtype=torch.bfloat16)
    lens = int_tensor(seq_lens)
    out = torch.empty_like(q)
    kw = {"max_seq_len": 512, "num_splits": 4, "out": out}
    paged_decode_attention(q, k_cache, v_cache, block_tables, lens, 0.088, **kw)  # warm up/compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_decode_attention(q, k_cache, v_cache, block_tables, lens, 0.088, **kw)
    for new_lens in ([512, 1, 0, 200], [17, 16, 15, 33]):
        lens.copy_(int_tensor(new_lens))
        q.copy_(randn(4, 8, 128, g=g, dtype=torch.bfloat16))
        block_tables.copy_(block_tables[torch.randperm(4, generator=g).to(DEVICE)])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = paged_decode_attention_ref(q, k_cache, v_cache, block_tables, lens, 0.088)
        assert_close(out, ref, torch.bfloat16)
