# paged_decode_attention's walks of a key range (kernels/paged_decode_walks.py: "keys",
# "blocks", "blocks_t", "blocks_ts"), each against paged_decode_attention_ref: 16-bit and e4m3
# caches, groups 1 to 16, splits, key_start with caller-owned partials (shared-prefix decode's
# suffix pass), padding rows, strided views and the layouts where "blocks" runs as "keys".
# Outputs start as NaN, so an element never written fails. Tolerances: kernel_test_utils.TOL.
import pytest
import torch

from kernels import paged_decode_attention as pda
from kernels.fp8_quant import FP8_DTYPE
from kernels.paged_decode_attention import paged_decode_attention, paged_decode_attention_ref
from kernels.paged_decode_walks import MAX_LANES, walk_layout
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

pytestmark = pytest.mark.usefixtures("decode_walk")  # conftest.py: every test in each walk
LOG2E = 1.4426950408889634


def _caches(seq_lens, *, num_kv_heads, head_dim, block_size, cache, g):
    """(k_cache, v_cache, block_tables) of `cache` dtype; e4m3 holds K / K_SCALE, V / V_SCALE."""
    dtype = torch.float32 if cache == FP8_DTYPE else cache
    k, v, tables = paged_kv(
        seq_lens, num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size,
        dtype=dtype, g=g,
    )  # fmt: skip
    if cache == FP8_DTYPE:
        k, v = fp8_kv(k, v)
    return k, v, tables


def _scales(cache):
    return {"k_scale": K_SCALE, "v_scale": V_SCALE} if cache == FP8_DTYPE else {}


# (q dtype, cache dtype, num_heads, num_kv_heads, head_dim, block_size, seq_lens, num_splits)
CASES = [
    # group 1, block boundaries, a padding row
    (torch.float32, torch.float32, 4, 4, 64, 16, [1, 15, 16, 17, 0, 48], 1),
    # group 4 (the 8B), several tiles (BLOCK_N 64), splits
    (torch.bfloat16, torch.bfloat16, 8, 2, 128, 16, [100, 1, 33, 64, 65, 0, 200], 3),
    # group 8 (the 70B), fp16, more splits than tiles for the short rows
    (torch.float16, torch.float16, 16, 2, 64, 16, [7, 130, 0, 257], 2),
    (torch.float32, torch.float32, 8, 1, 64, 8, [7, 8, 9, 97, 0], 5),
    # group 2, block size 32
    (torch.bfloat16, torch.bfloat16, 4, 2, 64, 32, [64, 1, 65, 0, 129], 1),
    # group 3 (not a power of two: "blocks" runs as "keys") and 16 (no padding rows to fill)
    (torch.float32, torch.float32, 6, 2, 64, 16, [50, 3, 16, 0], 2),
    (torch.bfloat16, torch.bfloat16, 16, 1, 64, 16, [90, 17], 1),
    # block size 2: "blocks" packs 2 lanes, not 4 (group 4); block size 1: "keys"
    (torch.float32, torch.float32, 8, 2, 64, 2, [9, 40, 0], 2),
    (torch.float32, torch.float32, 8, 1, 64, 1, [9, 33], 1),
    # e4m3 caches (BLOCK_N 128): groups 8, 4, 1; bf16 q (fp16 dots) and fp32 q (fp32 dots)
    (torch.bfloat16, FP8_DTYPE, 16, 2, 128, 16, [300, 1, 129, 0, 128], 1),
    (torch.bfloat16, FP8_DTYPE, 8, 2, 64, 16, [300, 77, 0, 255], 3),
    (torch.bfloat16, FP8_DTYPE, 2, 2, 64, 16, [31, 200], 2),
    (torch.float32, FP8_DTYPE, 8, 1, 64, 16, [140, 5], 2),
]


@pytest.mark.parametrize(
    ("dtype", "cache", "num_heads", "num_kv_heads", "head_dim", "block_size", "seq_lens",
     "num_splits"),
    CASES,
    ids=[f"{str(c[1])[6:]}-h{c[2]}kv{c[3]}-d{c[4]}-bs{c[5]}-s{c[7]}" for c in CASES],
)  # fmt: skip
def test_walk_matches_reference(
    dtype, cache, num_heads, num_kv_heads, head_dim, block_size, seq_lens, num_splits
):
    g = gen(sum(seq_lens) + num_heads)
    k_cache, v_cache, tables = _caches(
        seq_lens, num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size,
        cache=cache, g=g,
    )  # fmt: skip
    q = randn(len(seq_lens), num_heads, head_dim, g=g, dtype=dtype)
    lens = int_tensor(seq_lens)
    out = nan_like(q)
    paged_decode_attention(
        q, k_cache, v_cache, tables, lens, head_dim**-0.5, max_seq_len=max(seq_lens),
        num_splits=num_splits, out=out, **_scales(cache),
    )  # fmt: skip
    ref = paged_decode_attention_ref(
        q, k_cache, v_cache, tables, lens, head_dim**-0.5, **_scales(cache)
    )
    assert not out.isnan().any(), "some output elements were never written"
    assert_close(out, ref, dtype)


@pytest.mark.parametrize("widen", ["fp16", "q"])
def test_walk_over_e4m3_either_widening(widen, monkeypatch):
    monkeypatch.setattr(pda, "FP8_WIDEN", widen)
    g = gen(5)
    seq_lens = [1, 260, 77, 129, 0]
    k_cache, v_cache, tables = _caches(
        seq_lens, num_kv_heads=2, head_dim=64, block_size=16, cache=FP8_DTYPE, g=g
    )
    q = randn(len(seq_lens), 16, 64, g=g, dtype=torch.bfloat16)
    lens = int_tensor(seq_lens)
    ref = paged_decode_attention_ref(q, k_cache, v_cache, tables, lens, 0.125, **_scales(FP8_DTYPE))
    for splits in (1, 3):
        out = paged_decode_attention(
            q, k_cache, v_cache, tables, lens, 0.125, max_seq_len=260, num_splits=splits,
            out=nan_like(q), **_scales(FP8_DTYPE),
        )  # fmt: skip
        assert_close(out, ref, torch.bfloat16)


def _ref_from_key_start(q, k_cache, v_cache, tables, lens, key_start, scale, k_scale, v_scale):
    """paged_decode_attention_ref over keys [key_start, seq_len) of each row."""
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    ctx = int(lens.max())
    pos = torch.arange(ctx, device=q.device)
    blocks = tables[:, pos // block_size].long().clamp(min=0)  # [num_seqs, ctx]
    k = k_cache[blocks, pos % block_size].float() * k_scale
    v = v_cache[blocks, pos % block_size].float() * v_scale
    qg = q.float().view(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)
    s = torch.einsum("bhgd,bthd->bhgt", qg, k) * scale
    keep = (pos[None, :] >= key_start[:, None]) & (pos[None, :] < lens[:, None])
    s = s.masked_fill(~keep[:, None, None, :], float("-inf"))
    o = torch.einsum("bhgt,bthd->bhgd", torch.softmax(s, -1).nan_to_num(0.0), v)
    return o.reshape(q.shape)


@pytest.mark.parametrize("cache", [torch.bfloat16, FP8_DTYPE])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_walk_from_key_start_into_partials(cache, num_splits):
    # the suffix pass of shared-prefix decode: first keys anywhere (not on a tile or a lane),
    # partials in a caller's scratch with a slot more than the launch fills, reduced here
    g = gen(9 + num_splits)
    seq_lens = [300, 40, 129, 0, 64]
    starts = [37, 39, 128, 0, 5]
    k_cache, v_cache, tables = _caches(
        seq_lens, num_kv_heads=2, head_dim=64, block_size=16, cache=cache, g=g
    )
    q = randn(len(seq_lens), 16, 64, g=g, dtype=torch.bfloat16)
    lens, key_start = int_tensor(seq_lens), int_tensor(starts)
    slots = num_splits + 1
    part_max = torch.full((5, 16, slots), float("-inf"), device=DEVICE)
    part_sum = torch.zeros_like(part_max)
    part_acc = torch.full((5, 16, slots, 64), float("nan"), device=DEVICE)
    paged_decode_attention(
        q, k_cache, v_cache, tables, lens, 0.125, max_seq_len=300, num_splits=num_splits,
        key_start=key_start, partials=(part_max, part_sum, part_acc), **_scales(cache),
    )  # fmt: skip
    assert not part_max[:, :, :num_splits].isnan().any()
    # log2-domain partials: out = sum_s 2^(m_s - m) acc_s / sum_s 2^(m_s - m) l_s
    m = part_max.amax(-1, keepdim=True)
    w = torch.exp2(part_max - torch.where(m.isinf(), 0.0, m))
    acc = torch.where(w[..., None] > 0, part_acc, 0.0)
    out = (w[..., None] * acc).sum(2) / (w * part_sum).sum(-1).clamp(min=1e-30)[..., None]
    k_sc, v_sc = (K_SCALE, V_SCALE) if cache == FP8_DTYPE else (1.0, 1.0)
    ref = _ref_from_key_start(q, k_cache, v_cache, tables, lens, key_start, 0.125, k_sc, v_sc)
    assert_close(out, ref, torch.bfloat16)
    assert (part_sum[3] == 0).all() and (part_max[3] == float("-inf")).all()  # seq_len 0


@pytest.mark.parametrize("num_splits", [1, 3])
def test_walk_all_padding_rows(num_splits):
    # a CUDA-graph batch that is all padding: seq_len 0, block tables all -1
    g = gen(12)
    k_cache, v_cache, _ = _caches([16], num_kv_heads=2, head_dim=64, block_size=16,
                                  cache=FP8_DTYPE, g=g)  # fmt: skip
    tables = torch.full((3, 4), -1, dtype=torch.int32, device=DEVICE)
    q = randn(3, 16, 64, g=g, dtype=torch.bfloat16)
    out = nan_like(q)
    paged_decode_attention(
        q, k_cache, v_cache, tables, int_tensor([0, 0, 0]), 0.125, max_seq_len=0,
        num_splits=num_splits, out=out, **_scales(FP8_DTYPE),
    )  # fmt: skip
    assert torch.equal(out, torch.zeros_like(out))


def test_walk_strided_views_order_and_int64_metadata():
    # q a view of a fused qkv output, out a view of a wider buffer, the caches views of one
    # [blocks, slots, 2 * kv_heads, d] tensor (slot stride twice theirs), int64 metadata, and an
    # order of the rows
    g = gen(13)
    seq_lens = [200, 3, 47, 0]
    num_heads, num_kv_heads, head_dim = 16, 2, 64
    k_cache, v_cache, tables = _caches(
        seq_lens, num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=16,
        cache=torch.bfloat16, g=g,
    )  # fmt: skip
    kv = torch.cat([k_cache, v_cache], dim=2)
    k_view, v_view = kv[:, :, :num_kv_heads], kv[:, :, num_kv_heads:]
    qkv = randn(4, num_heads + 2 * num_kv_heads, head_dim, g=g, dtype=torch.bfloat16)
    q = qkv[:, :num_heads]
    out_buf = torch.full((4, num_heads + 1, head_dim), float("nan"), device=DEVICE)
    out_buf = out_buf.to(torch.bfloat16)
    out = out_buf[:, 1:]
    lens, bt = int_tensor(seq_lens, torch.int64), tables.long()
    order = int_tensor([0, 2, 1, 3])
    paged_decode_attention(
        q, k_view, v_view, bt, lens, 0.125, max_seq_len=200, num_splits=2, out=out,
        seq_order=order,
    )  # fmt: skip
    ref = paged_decode_attention_ref(q, k_cache, v_cache, bt, lens, 0.125)
    assert_close(out, ref, torch.bfloat16)
    assert out_buf[:, 0].isnan().all(), "wrote outside the out view"


def test_walk_layout(decode_walk):
    # which walk runs, its output rows and lanes: "blocks" only where its packing fits
    if decode_walk == "keys":
        assert walk_layout("keys", 8, 16) == ("keys", 16, 1)
        assert walk_layout("keys", 32, 16) == ("keys", 32, 1)
    elif decode_walk == "blocks":
        assert walk_layout("blocks", 8, 16) == ("blocks", 8, 2)  # the 70B: 16 real rows
        assert walk_layout("blocks", 4, 16) == ("blocks", 4, MAX_LANES)  # the 8B
        assert walk_layout("blocks", 1, 16) == ("blocks", 1, MAX_LANES)
        assert walk_layout("blocks", 4, 2) == ("blocks", 4, 2)  # a packed row within a block
        assert walk_layout("blocks", 4, 1) == ("keys", 16, 1)
        assert walk_layout("blocks", 3, 16) == ("keys", 16, 1)  # not a power of two
        assert walk_layout("blocks", 16, 16) == ("keys", 16, 1)  # no padding rows
    else:
        assert walk_layout(decode_walk, 8, 16) == (decode_walk, 8, 1)
        assert walk_layout(decode_walk, 4, 16) == (decode_walk, 8, 1)  # the mma's N is 8
        assert walk_layout(decode_walk, 16, 1) == (decode_walk, 16, 1)
    with pytest.raises(ValueError):
        walk_layout("rows", 8, 16)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("cache", [torch.bfloat16, FP8_DTYPE])
@pytest.mark.parametrize(("num_heads", "num_splits"), [(64, None), (64, 1), (64, 8), (32, 3)])
def test_walk_gpu_realistic(cache, num_heads, num_splits):
    # real tensor-core dots: the 70B's heads (64 query, 8 KV) and the 8B's (32, 8), head_dim
    # 128, long uneven contexts with a padding row
    g = gen(16)
    seq_lens = [1, 16, 17, 511, 512, 513, 2000, 4096, 0, 3001]
    k_cache, v_cache, tables = _caches(
        seq_lens, num_kv_heads=8, head_dim=128, block_size=16, cache=cache, g=g
    )
    q = randn(len(seq_lens), num_heads, 128, g=g, dtype=torch.bfloat16)
    lens = int_tensor(seq_lens)
    out = nan_like(q)
    paged_decode_attention(
        q, k_cache, v_cache, tables, lens, 128**-0.5, max_seq_len=4096, num_splits=num_splits,
        out=out, **_scales(cache),
    )  # fmt: skip
    ref = paged_decode_attention_ref(q, k_cache, v_cache, tables, lens, 128**-0.5, **_scales(cache))
    assert not out.isnan().any()
    assert_close(out, ref, torch.bfloat16)


@pytest.mark.gpu
@requires_gpu
def test_walk_cuda_graph_replay():
    # captured once over an e4m3 cache at the 70B's group, replayed with new lengths and tables
    g = gen(17)
    k_cache, v_cache, tables = _caches(
        [512] * 4, num_kv_heads=2, head_dim=128, block_size=16, cache=FP8_DTYPE, g=g
    )
    q = randn(4, 16, 128, g=g, dtype=torch.bfloat16)
    lens = int_tensor([300, 5, 77, 0])
    out = torch.empty_like(q)
    kw = {"max_seq_len": 512, "num_splits": 4, "out": out, **_scales(FP8_DTYPE)}
    paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.088, **kw)  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.088, **kw)
    for new_lens in ([512, 1, 0, 200], [17, 16, 15, 33]):
        lens.copy_(int_tensor(new_lens))
        q.copy_(randn(4, 16, 128, g=g, dtype=torch.bfloat16))
        tables.copy_(tables[torch.randperm(4, generator=g).to(DEVICE)])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = paged_decode_attention_ref(
            q, k_cache, v_cache, tables, lens, 0.088, **_scales(FP8_DTYPE)
        )
        assert_close(out, ref, torch.bfloat16)
