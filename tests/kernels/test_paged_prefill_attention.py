# paged_prefill_attention (Triton, causal varlen over the paged cache) against
# paged_prefill_attention_ref. Tolerances: kernel_test_utils.TOL (fp32 rtol 1e-4 / atol 1e-5,
# bf16 rtol 1.6e-2 / atol 1e-2). Outputs start as NaN: every real query token must be written,
# and padding tokens after query_start_loc[-1] must be left untouched (as the reference does).
import pytest
import torch

from kernels.paged_prefill_attention import (
    paged_prefill_attention,
    paged_prefill_attention_ref,
    prefill_num_splits,
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
    requires_gpu,
)


def _run_case(
    q_lens, seq_lens, *, num_heads, num_kv_heads, head_dim, block_size, dtype, seed, pad_tokens=2
):
    g = gen(seed)
    k_cache, v_cache, block_tables = paged_kv(
        seq_lens,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        g=g,
    )
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    num_tokens = starts[-1] + pad_tokens  # CUDA-graph padding rows at the end
    q = randn(num_tokens, num_heads, head_dim, g=g, dtype=dtype)
    lens = int_tensor(seq_lens)
    qsl = int_tensor(starts)
    scale = head_dim**-0.5
    out = nan_like(q)
    ret = paged_prefill_attention(
        q, k_cache, v_cache, block_tables, lens, qsl, max(q_lens), scale, out=out
    )
    assert ret is out
    ref = paged_prefill_attention_ref(
        q, k_cache, v_cache, block_tables, lens, qsl, max(q_lens), scale, out=nan_like(q)
    )
    n = starts[-1]
    assert not out[:n].isnan().any(), "some query rows were never written"
    assert out[n:].isnan().all(), "padding tokens were written"
    assert_close(out[:n], ref[:n], dtype)
    return out[:n]


# (dtype, num_heads, num_kv_heads, head_dim, block_size, q_lens, seq_lens)
CASES = [
    # plain prefill (q_len == seq_len), GQA ratio 1, block boundaries and a one-token prompt
    (torch.float32, 2, 2, 64, 16, [1, 15, 16, 17, 40], [1, 15, 16, 17, 40]),
    # chunked prefill / prefix-cache hits: chunks attend to earlier cached blocks; ratio 4, d128
    (torch.float32, 8, 2, 128, 16, [5, 16, 33], [37, 48, 64]),
    # q_len == 1 rows (decode through the extend kernel) next to a chunk; ratio 8, block_size 8
    (torch.float32, 8, 1, 64, 8, [1, 1, 20, 1], [1, 97, 24, 8]),
    # a padded sequence (q_len 0, seq_len 0) in the middle
    (torch.float32, 4, 1, 64, 16, [9, 0, 12], [9, 0, 30]),
    # bf16, ratios 4 and 1, head_dim 128 and 64; long chunk over a cached prefix
    (torch.bfloat16, 8, 2, 128, 16, [24, 3], [56, 3]),
    (torch.bfloat16, 2, 2, 64, 32, [70, 1, 31], [70, 33, 95]),
    # fp16, speculative-verification-sized chunks
    (torch.float16, 4, 2, 64, 16, [4, 4, 4], [4, 50, 17]),
]


@pytest.mark.parametrize(
    ("dtype", "num_heads", "num_kv_heads", "head_dim", "block_size", "q_lens", "seq_lens"),
    CASES,
    ids=[f"{str(c[0])[6:]}-h{c[1]}kv{c[2]}-d{c[3]}-bs{c[4]}-{i}" for i, c in enumerate(CASES)],
)
def test_prefill_matches_reference(
    dtype, num_heads, num_kv_heads, head_dim, block_size, q_lens, seq_lens
):
    _run_case(
        q_lens,
        seq_lens,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        seed=sum(seq_lens) * 7 + num_heads,
    )


# (q_lens, seq_lens, num_splits): short chunks over long prefixes cut into key ranges, a split
# count that leaves the last ranges empty for the shorter sequences, and a padded sequence
SPLIT_CASES = [
    ([3, 1], [300, 150], 4),
    ([7, 20, 0], [520, 40, 0], 3),
    ([16], [1000], 16),
    ([2, 5, 1], [64, 700, 17], 7),
]


@pytest.mark.parametrize(("q_lens", "seq_lens", "num_splits"), SPLIT_CASES)
@pytest.mark.parametrize("fp8", [False, True], ids=["f32", "e4m3"])
def test_split_key_ranges_match_the_reference(q_lens, seq_lens, num_splits, fp8):
    g = gen(sum(seq_lens) + num_splits)
    num_heads, num_kv_heads, head_dim, block_size = 8, 2, 64, 16
    k_cache, v_cache, tables = paged_kv(
        seq_lens, num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size,
        dtype=torch.float32, g=g,
    )  # fmt: skip
    scales = {}
    if fp8:
        k_cache, v_cache = fp8_kv(k_cache, v_cache)
        scales = {"k_scale": K_SCALE, "v_scale": V_SCALE}
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    q = randn(starts[-1] + 2, num_heads, head_dim, g=g)  # two padding tokens at the end
    lens, qsl = int_tensor(seq_lens), int_tensor(starts)
    out = paged_prefill_attention(
        q, k_cache, v_cache, tables, lens, qsl, max(q_lens), 0.125, out=nan_like(q),
        num_splits=num_splits, **scales,
    )  # fmt: skip
    ref = paged_prefill_attention_ref(
        q, k_cache, v_cache, tables, lens, qsl, max(q_lens), 0.125, **scales
    )
    n = starts[-1]
    assert_close(out[:n], ref[:n], torch.float32)
    assert (out[n:] == 0).all()  # the reduce writes padding tokens as zeros
    one = paged_prefill_attention(
        q, k_cache, v_cache, tables, lens, qsl, max(q_lens), 0.125, **scales
    )
    torch.testing.assert_close(out[:n], one[:n], rtol=1e-5, atol=1e-6)


def test_the_split_count_fills_idle_sms_only():
    # The 8B's document chunk on an H100: 74 tokens x 4 heads of a group at a 21.6k offset, 8 KV
    # heads: 3 row tiles, 24 programs on 132 SMs, so ~11 splits of ~2k keys.
    assert prefill_num_splits(1, 74, 21_600, 4, 8, 132) == 11
    # A 2,048-token chunk fills the GPU alone; short sequences keep >= 512 keys a split.
    assert prefill_num_splits(1, 2048, 21_600, 4, 8, 132) == 1
    assert prefill_num_splits(1, 74, 1_100, 4, 8, 132) == 2
    assert prefill_num_splits(1, 74, 400, 4, 8, 132) == 1
    assert prefill_num_splits(1, 4, 1 << 20, 8, 1, 132) == 64  # capped


def test_prefill_chunked_equals_whole_prompt():
    # the same 50-token prompt attended in one chunk and in chunks of 20 / 17 / 13 over the
    # cache must give the same rows
    g = gen(21)
    num_heads, num_kv_heads, head_dim, block_size, total = 4, 2, 64, 16, 50
    k_cache, v_cache, block_tables = paged_kv(
        [total],
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=torch.float32,
        g=g,
    )
    q = randn(total, num_heads, head_dim, g=g)
    whole = paged_prefill_attention(
        q, k_cache, v_cache, block_tables, int_tensor([total]), int_tensor([0, total]), total, 0.125
    )
    done = 0
    for chunk in (20, 17, 13):
        part = paged_prefill_attention(
            q[done : done + chunk],
            k_cache,
            v_cache,
            block_tables,
            int_tensor([done + chunk]),
            int_tensor([0, chunk]),
            chunk,
            0.125,
        )
        torch.testing.assert_close(part, whole[done : done + chunk], rtol=1e-5, atol=1e-6)
        done += chunk


def test_prefill_strided_views():
    # q as a view of a fused qkv output and out as a view of a wider buffer (the engine passes
    # out[num_decodes:]); int64 metadata
    g = gen(22)
    seq_lens = [6, 40]  # q_lens 6 and 11
    num_heads, num_kv_heads, head_dim = 4, 2, 64
    k_cache, v_cache, block_tables = paged_kv(
        seq_lens,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=16,
        dtype=torch.float32,
        g=g,
    )
    qkv = randn(17, num_heads + 2 * num_kv_heads, head_dim, g=g)
    q = qkv[:, :num_heads]
    out_buf = torch.full((17, num_heads + 1, head_dim), float("nan"), device=DEVICE)
    out = out_buf[:, 1:]
    lens, qsl, bt = (
        int_tensor(seq_lens, torch.int64),
        int_tensor([0, 6, 17], torch.int64),
        block_tables.long(),
    )
    paged_prefill_attention(q, k_cache, v_cache, bt, lens, qsl, 11, 0.125, out=out)
    ref = paged_prefill_attention_ref(q, k_cache, v_cache, bt, lens, qsl, 11, 0.125)
    assert_close(out, ref, torch.float32)
    assert out_buf[:, 0].isnan().all(), "wrote outside the out view"


def test_prefill_empty_batch_and_no_queries():
    g = gen(23)
    k_cache, v_cache, block_tables = paged_kv(
        [4], num_kv_heads=1, head_dim=64, block_size=16, dtype=torch.float32, g=g
    )
    q = randn(3, 2, 64, g=g)
    out = nan_like(q)
    # all rows are padding: one sequence with no queries
    paged_prefill_attention(
        q, k_cache, v_cache, block_tables, int_tensor([0]), int_tensor([0, 0]), 0, 0.1, out=out
    )
    assert out.isnan().all()


def _bad_prefill_args(case):
    g = gen(24)
    k_cache, v_cache, block_tables = paged_kv(
        [10, 20], num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.float32, g=g
    )
    q = randn(12, 4, 64, g=g)
    lens = int_tensor([10, 20])
    qsl = int_tensor([0, 10, 12])
    max_query_len, kw = 10, {}
    if case == "q_ndim":
        q = q.view(12, 256)
    elif case == "heads_not_multiple":
        q = randn(12, 3, 64, g=g)
    elif case == "head_dim_mismatch":
        q = randn(12, 4, 128, g=g)
    elif case == "dtype_mismatch":
        v_cache = v_cache.bfloat16()
    elif case == "query_start_loc_len":
        qsl = qsl[:2]
    elif case == "query_start_loc_dtype":
        qsl = qsl.float()
    elif case == "block_tables_rows":
        block_tables = block_tables[:1]
    elif case == "max_query_len_not_int":
        max_query_len = lens.max()
    elif case == "max_query_len_negative":
        max_query_len = -1
    elif case == "out_shape":
        kw["out"] = torch.empty(11, 4, 64, device=DEVICE)
    elif case == "cache_last_dim_stride":
        k_cache = k_cache.transpose(2, 3).contiguous().transpose(2, 3)
    return (q, k_cache, v_cache, block_tables, lens, qsl, max_query_len, 0.125), kw


@pytest.mark.parametrize(
    "case",
    [
        "q_ndim",
        "heads_not_multiple",
        "head_dim_mismatch",
        "dtype_mismatch",
        "query_start_loc_len",
        "query_start_loc_dtype",
        "block_tables_rows",
        "max_query_len_not_int",
        "max_query_len_negative",
        "out_shape",
        "cache_last_dim_stride",
    ],
)
def test_prefill_rejects_bad_inputs(case):
    args, kw = _bad_prefill_args(case)
    with pytest.raises(ValueError):
        paged_prefill_attention(*args, **kw)


@pytest.mark.gpu
@requires_gpu
def test_prefill_gpu_bf16_realistic():
    # real bf16 tensor-core dots: 32 q heads / 8 kv heads, long prompts and chunks over prefixes
    _run_case(
        [1000, 1, 257, 512, 33],
        [1000, 700, 1024, 512, 2000],
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=16,
        dtype=torch.bfloat16,
        seed=25,
    )


@pytest.mark.gpu
@requires_gpu
def test_split_key_ranges_gpu_bf16_realistic():
    # the H100's 8B document chunk: 74 tokens at a ~21.5k offset, 32 / 8 heads, real bf16 dots,
    # cut into the launcher's own count of key ranges, beside a decode row and a short prompt
    seq_lens = [900, 21_600, 3_000]  # chunks of 1, 74 and 40 tokens
    g = gen(77)
    k_cache, v_cache, tables = paged_kv(
        seq_lens, num_kv_heads=8, head_dim=128, block_size=16, dtype=torch.bfloat16, g=g
    )
    qsl = int_tensor([0, 1, 75, 115])
    q = randn(115, 32, 128, g=g, dtype=torch.bfloat16)
    lens = int_tensor(seq_lens)
    num_sms = torch.cuda.get_device_properties(DEVICE).multi_processor_count
    splits = prefill_num_splits(3, 74, 21_600, 4, 8, num_sms)
    assert splits > 1
    out = paged_prefill_attention(
        q, k_cache, v_cache, tables, lens, qsl, 74, 128**-0.5, num_splits=splits
    )
    ref = paged_prefill_attention_ref(q, k_cache, v_cache, tables, lens, qsl, 74, 128**-0.5)
    assert_close(out, ref, torch.bfloat16)
