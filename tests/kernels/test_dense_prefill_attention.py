# dense_prefill_attention (Triton: the chunk's own keys from the new-token k/v, a cached prefix
# through the paged cache) against dense_prefill_attention_ref, and that reference against
# paged_prefill_attention_ref once store_kv has written the chunk into the cache: the engine may
# call either kernel for a prefill. Tolerances: kernel_test_utils.TOL. Outputs start as NaN:
# every real query token must be written and padding tokens must stay untouched.
import itertools

import pytest
import torch

import kernels.dense_prefill_attention as dense_mod
import kernels.dense_prefill_ws as ws_mod
from kernels.dense_prefill_attention import (
    CONFIGS_TO_SWEEP,
    CONFIGS_WARP_SPEC,
    PrefillConfig,
    config_label,
    dense_prefill_attention,
    dense_prefill_attention_ref,
)
from kernels.paged_prefill_attention import paged_prefill_attention, paged_prefill_attention_ref
from kernels.store_kv import store_kv_ref
from tests.kernels.kernel_test_utils import (
    DEVICE,
    ON_GPU,
    assert_close,
    gen,
    int_tensor,
    nan_like,
    paged_kv,
    randn,
)

# Small tiles under the interpreter: several full and diagonal tiles per program, and both load
# paths (pointers, and the host tensor descriptors of the copy engine); the register cap (a
# compile option: the same kernel under the interpreter); the warp-specialized kernel with
# in-kernel and host descriptors (16-bit only: fp32 falls back to the default kernel).
SMALL = PrefillConfig(32, 16, 4, 2)
SMALL_TMA = PrefillConfig(32, 16, 4, 2, True)
SMALL_R128 = PrefillConfig(32, 16, 4, 2, True, maxnreg=128)
SMALL_WS = PrefillConfig(32, 16, 4, 2, warp_spec=True)
SMALL_WS_HOST = PrefillConfig(32, 16, 4, 2, True, warp_spec=True)
SMALL_LAZY = PrefillConfig(32, 16, 4, 2, lazy=True)  # lazy rescaling (LAZY_THRESHOLD)
SMALL_LAZY_TMA = PrefillConfig(32, 16, 4, 2, True, lazy=True)
SMALL_CONFIGS = [None, SMALL, SMALL_TMA, SMALL_R128, SMALL_WS, SMALL_WS_HOST, SMALL_LAZY]


def _case(q_lens, ctx_lens, *, num_heads, num_kv_heads, head_dim, block_size, dtype, seed):
    """Random q/k/v for packed chunks after ctx_lens cached keys, the chunk's k/v stored into a
    shuffled paged cache (as store_kv does before attention); two padding tokens at the end."""
    g = gen(seed)
    seq_lens = [c + n for c, n in zip(ctx_lens, q_lens)]
    k_cache, v_cache, block_tables = paged_kv(
        seq_lens, num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size,
        dtype=dtype, g=g,
    )  # fmt: skip
    starts, slots = [0], []
    for i, (ctx, n) in enumerate(zip(ctx_lens, q_lens)):
        starts.append(starts[-1] + n)
        slots += [int(block_tables[i, p // block_size]) * block_size + p % block_size
                  for p in range(ctx, ctx + n)]  # fmt: skip
    num_tokens = starts[-1] + 2
    q = randn(num_tokens, num_heads, head_dim, g=g, dtype=dtype)
    k = randn(num_tokens, num_kv_heads, head_dim, g=g, dtype=dtype)
    v = randn(num_tokens, num_kv_heads, head_dim, g=g, dtype=dtype)
    slot_mapping = torch.tensor([*slots, -1, -1], dtype=torch.int64, device=DEVICE)
    store_kv_ref(k, v, k_cache, v_cache, slot_mapping)
    meta = (block_tables, int_tensor(seq_lens), int_tensor(starts), max(q_lens))
    return q, k, v, k_cache, v_cache, meta, starts[-1]


def _check(q_lens, ctx_lens, config=None, **shape):
    q, k, v, k_cache, v_cache, meta, n = _case(q_lens, ctx_lens, **shape)
    dtype, scale = shape["dtype"], shape["head_dim"] ** -0.5
    out = nan_like(q)
    ret = dense_prefill_attention(q, k, v, k_cache, v_cache, *meta, scale, out=out, config=config)
    assert ret is out
    ref = dense_prefill_attention_ref(q, k, v, k_cache, v_cache, *meta, scale, out=nan_like(q))
    assert not out[:n].isnan().any(), "some query rows were never written"
    assert out[n:].isnan().all(), "padding tokens were written"
    assert_close(out[:n], ref[:n], dtype)
    return q, k_cache, v_cache, meta, ref, n


# (dtype, num_heads, num_kv_heads, head_dim, block_size, q_lens, ctx_lens)
CASES = [
    # whole new prompts, GQA ratio 1: one token, block boundaries, lengths off the tile sizes
    (torch.float32, 2, 2, 64, 16, [1, 15, 16, 17, 40], [0, 0, 0, 0, 0]),
    # ratio 4, head_dim 128
    (torch.float32, 8, 2, 128, 16, [5, 33, 20], [0, 0, 0]),
    # ratio 8, block size 8; a padded sequence (q_len 0) in the middle
    (torch.float32, 8, 1, 64, 8, [37, 0, 3], [0, 0, 0]),
    # cached prefixes (prefix-cache hits, later chunks, a one-token row) beside a new prompt
    (torch.float32, 8, 2, 64, 16, [5, 16, 33, 1, 9], [0, 32, 31, 40, 7]),
    # bf16 and fp16 (the warp-specialized kernel's cases): prefixes, ratios 1 / 4 / 8, a padded
    # sequence, one-token rows, lengths off the tile sizes
    (torch.bfloat16, 8, 2, 128, 16, [24, 3], [0, 19]),
    (torch.bfloat16, 2, 2, 64, 32, [70, 31], [0, 64]),
    (torch.float16, 4, 1, 64, 16, [4, 21], [0, 17]),
    (torch.bfloat16, 8, 1, 64, 8, [37, 0, 3], [0, 0, 0]),
    (torch.float16, 8, 2, 64, 16, [5, 16, 33, 1, 9], [0, 32, 31, 40, 7]),
]


@pytest.mark.parametrize("config", SMALL_CONFIGS, ids=lambda c: config_label(c) if c else "default")
@pytest.mark.parametrize(
    ("dtype", "num_heads", "num_kv_heads", "head_dim", "block_size", "q_lens", "ctx_lens"),
    CASES,
    ids=[f"{str(c[0])[6:]}-h{c[1]}kv{c[2]}-d{c[3]}-bs{c[4]}-{i}" for i, c in enumerate(CASES)],
)
def test_dense_prefill_matches_reference(
    config, dtype, num_heads, num_kv_heads, head_dim, block_size, q_lens, ctx_lens
):
    _check(
        q_lens, ctx_lens, config, num_heads=num_heads, num_kv_heads=num_kv_heads,
        head_dim=head_dim, block_size=block_size, dtype=dtype, seed=sum(q_lens) + num_heads,
    )  # fmt: skip


# log2 score of key p (before noise) for test_dense_prefill_lazy_rescale_exact, BLOCK_N = 16
_LAZY_PROFILES = {
    "random": None,  # the first tile sets the max, later ones rarely move it
    "every_tile": lambda p: 10.0 * p / 16,  # +10 a tile (> LAZY_THRESHOLD): always rescales
    "every_other": lambda p: 9.0 * (p // 32),  # +9 every other tile, flat between
    "below": lambda p: 6.0 * (p // 16),  # +6 a tile: p up to 2^6, then 2^12 > 2^8 rescales
}


@pytest.mark.parametrize("config", [SMALL, SMALL_LAZY, SMALL_LAZY_TMA], ids=config_label)
@pytest.mark.parametrize("profile", list(_LAZY_PROFILES))
def test_dense_prefill_lazy_rescale_exact(config, profile):
    # q pinned near one direction and keys whose scores (log2 units, scaled) grow along the
    # sequence by a profile, so the running max moves past LAZY_THRESHOLD on some tiles and not
    # on others. Exact up to 16-bit rounding against the fp32 reference, a cached prefix (random
    # keys from the cache) included.
    shape = dict(num_heads=4, num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.bfloat16)
    q, k, v, k_cache, v_cache, meta, n = _case([70, 33], [0, 20], **shape, seed=17)
    scale = 64**-0.5
    ones = torch.ones(64, device=DEVICE)
    q.copy_((q.float() * 0.05 + ones / 8).to(q.dtype))  # q . (c * ones) ~ 8 c
    if _LAZY_PROFILES[profile]:
        pos = torch.arange(k.shape[0], device=DEVICE, dtype=torch.float32)
        starts = meta[2].tolist()
        for s0, s1 in itertools.pairwise(starts):  # positions within each chunk
            pos[s0:s1] -= s0
        target = _LAZY_PROFILES[profile](pos)  # log2 units: 8 c * scale * log2(e)
        c = target / (8 * scale * 1.4426950408889634)
        k.copy_((k.float() * 0.05 + c[:, None, None] * ones).to(k.dtype))
    out = nan_like(q)
    dense_prefill_attention(q, k, v, k_cache, v_cache, *meta, scale, out=out, config=config)
    ref = dense_prefill_attention_ref(q, k, v, k_cache, v_cache, *meta, scale)
    assert not out[:n].isnan().any()
    assert_close(out[:n], ref[:n], torch.bfloat16)


def test_dense_reference_equals_paged_reference():
    # with the chunk stored into the cache, the two prefill paths compute the same thing
    shape = dict(num_heads=8, num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.float32)
    q, k, v, k_cache, v_cache, meta, n = _case([7, 30, 1], [0, 18, 50], **shape, seed=3)
    dense = dense_prefill_attention_ref(q, k, v, k_cache, v_cache, *meta, 0.125)
    paged = paged_prefill_attention_ref(q, k_cache, v_cache, *meta, 0.125)
    torch.testing.assert_close(dense[:n], paged[:n], rtol=1e-6, atol=1e-6)


def test_dense_prefill_strided_views():
    # q/k/v as views of a fused qkv output (the engine's), out as a view of a wider buffer,
    # int64 metadata; the descriptors take the views (tma_ready) or fall back to pointers
    g = gen(31)
    num_heads, num_kv_heads, head_dim, q_lens = 4, 2, 64, [6, 11]
    seq_lens = q_lens
    k_cache, v_cache, bt = paged_kv(
        seq_lens, num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=16,
        dtype=torch.float32, g=g,
    )  # fmt: skip
    qkv = randn(17, num_heads + 2 * num_kv_heads, head_dim, g=g)
    q, k, v = qkv.split([num_heads, num_kv_heads, num_kv_heads], dim=1)
    out_buf = torch.full((17, num_heads + 1, head_dim), float("nan"), device=DEVICE)
    out = out_buf[:, 1:]
    lens, qsl = int_tensor(seq_lens, torch.int64), int_tensor([0, 6, 17], torch.int64)
    ref = dense_prefill_attention_ref(q, k, v, k_cache, v_cache, bt.long(), lens, qsl, 11, 0.125)
    for config in (None, SMALL_TMA, SMALL_WS):  # fp32: the warp-specialized config falls back
        out_buf[:, 1:] = float("nan")
        dense_prefill_attention(
            q, k, v, k_cache, v_cache, bt.long(), lens, qsl, 11, 0.125, out=out, config=config
        )
        assert_close(out, ref, torch.float32)
        assert out_buf[:, 0].isnan().all(), "wrote outside the out view"


def _spy_ws(monkeypatch) -> list:
    """Records the chunk kernel's config of every warp-specialized launch."""
    calls, launch_ws = [], dense_mod.launch_ws

    def spy(*args):
        calls.append(args[-2])
        return launch_ws(*args)

    monkeypatch.setattr(dense_mod, "launch_ws", spy)
    return calls


@pytest.mark.parametrize("config", [SMALL_WS, SMALL_WS_HOST], ids=config_label)
def test_dense_prefill_ws_fused_qkv_views(monkeypatch, config):
    # bf16 q/k/v as views of one fused qkv buffer (the engine's) take the warp-specialized path;
    # out a view of a wider buffer, int64 metadata, a cached prefix merged into one sequence
    calls = _spy_ws(monkeypatch)
    g = gen(41)
    num_heads, num_kv_heads, head_dim, q_lens, ctx_lens = 8, 2, 64, [45, 19], [0, 23]
    seq_lens = [c + n for c, n in zip(ctx_lens, q_lens)]
    k_cache, v_cache, bt = paged_kv(
        seq_lens, num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=16,
        dtype=torch.bfloat16, g=g,
    )  # fmt: skip
    qkv = randn(66, num_heads + 2 * num_kv_heads, head_dim, g=g, dtype=torch.bfloat16)
    q, k, v = qkv.split([num_heads, num_kv_heads, num_kv_heads], dim=1)
    for i, (c, n, start) in enumerate(zip(ctx_lens, q_lens, [0, 45])):  # the chunk in the cache
        for p in range(n):
            blk, slot = int(bt[i, (c + p) // 16]), (c + p) % 16
            k_cache[blk, slot], v_cache[blk, slot] = k[start + p], v[start + p]
    out_buf = torch.full((66, num_heads + 1, head_dim), float("nan"), device=DEVICE,
                         dtype=torch.bfloat16)  # fmt: skip
    out = out_buf[:, 1:]
    lens, qsl = int_tensor(seq_lens, torch.int64), int_tensor([0, 45, 64], torch.int64)
    meta = (bt.long(), lens, qsl, 45)
    ref = dense_prefill_attention_ref(q, k, v, k_cache, v_cache, *meta, 0.125)
    dense_prefill_attention(q, k, v, k_cache, v_cache, *meta, 0.125, out=out, config=config)
    assert calls == [config]
    assert_close(out[:64], ref[:64], torch.bfloat16)
    assert out_buf[:, 0].isnan().all(), "wrote outside the out view"
    assert out_buf[64:].isnan().all(), "padding tokens were written"


def test_dense_prefill_ws_falls_back(monkeypatch):
    # fp32, or k/v whose heads are not adjacent (no 2-D descriptor view): the default kernel
    calls = _spy_ws(monkeypatch)
    shape = dict(num_heads=4, num_kv_heads=2, head_dim=64, block_size=16)
    for dtype, narrow in ((torch.float32, False), (torch.bfloat16, True)):
        q, k, v, k_cache, v_cache, meta, n = _case([9, 20], [0, 5], **shape, dtype=dtype, seed=9)
        if narrow:  # k, v: [tokens, kv_heads, 64] inside a [tokens, kv_heads, 128] buffer
            wide = torch.zeros(*k.shape[:2], 128, dtype=dtype, device=DEVICE)
            k = wide.clone()[:, :, :64].copy_(k)
            v = wide.clone()[:, :, :64].copy_(v)
        ref = dense_prefill_attention_ref(q, k, v, k_cache, v_cache, *meta, 0.125)
        out = dense_prefill_attention(q, k, v, k_cache, v_cache, *meta, 0.125, config=SMALL_WS)
        assert_close(out[:n], ref[:n], dtype)
    assert calls == []


def test_dense_prefill_ws_as_default(monkeypatch):
    # CONFIG_16BIT is a warp_spec config (as on the H200): chunks of at least block_m and
    # WS_MIN_QUERIES queries take it; shorter chunks and fp32 the plain kernel
    assert dense_mod.CONFIG_16BIT.warp_spec
    calls = _spy_ws(monkeypatch)
    monkeypatch.setattr(dense_mod, "CONFIG_16BIT", SMALL_WS)
    monkeypatch.setattr(dense_mod, "WS_MIN_QUERIES", 36)
    shape = dict(num_heads=8, num_kv_heads=2, head_dim=64, block_size=16)
    runs = [(torch.bfloat16, [40, 7]), (torch.bfloat16, [34, 7]), (torch.bfloat16, [20, 7]),
            (torch.float32, [40, 7])]  # fmt: skip
    for i, (dtype, q_lens) in enumerate(runs):
        _check(q_lens, [0, 9], None, **shape, dtype=dtype, seed=50 + i)
    assert calls == [SMALL_WS]
    # a GPU that is not sm_90 (say an A100) keeps the plain kernel as its default
    monkeypatch.setattr(dense_mod, "ws_supported", lambda device: False)
    _check([40, 7], [0, 9], None, **shape, dtype=torch.bfloat16, seed=60)
    assert calls == [SMALL_WS]


# host descriptors read q rows past a chunk's end (NaN padding): rows never stored
@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")
@pytest.mark.parametrize("config", [None, SMALL_TMA, SMALL_WS, SMALL_WS_HOST], ids=str)
def test_dense_prefill_nan_past_the_chunks(config):
    # k/v rows past the last chunk (padding) may hold anything: masked loads, descriptors
    # bounded by each chunk, or host descriptors whose last tile ends at the chunk's end never
    # let them into a real row
    shape = dict(num_heads=8, num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.bfloat16)
    q, k, v, k_cache, v_cache, meta, n = _case([24, 3, 37], [0, 19, 40], **shape, seed=3)
    k[n:], v[n:], q[n:] = float("nan"), float("nan"), float("nan")
    ref = dense_prefill_attention_ref(q, k, v, k_cache, v_cache, *meta, 0.125)
    out = dense_prefill_attention(q, k, v, k_cache, v_cache, *meta, 0.125, config=config)
    assert_close(out[:n], ref[:n], torch.bfloat16)


def _nan_lse_scratch(monkeypatch) -> None:
    """The warp-specialized launcher's log-sum-exp scratch starts as NaN (torch.empty may hold
    anything): the merge must read only rows the chunk kernel wrote."""
    real = ws_mod._lse_scratch
    monkeypatch.setattr(ws_mod, "_lse_scratch", lambda *a: real(*a).fill_(float("nan")))


# The H200 sweep's NaN case in miniature (one chunk of whole tiles, GQA 4, q/k/v views of one
# fused qkv buffer), beside chunks shorter than block_m and block_n, a one-token chunk, lengths
# off the tiles, with and without cached prefixes; 64/64: block_n == block_m, like 128/128
WS_TILE_CONFIGS = [SMALL_WS, SMALL_WS_HOST, PrefillConfig(64, 64, 4, 2, warp_spec=True)]
WS_TILE_CASES = [([128], [0]), ([5, 64, 1, 3, 40], [0] * 5), ([5, 64, 1, 3, 40], [0, 17, 3, 0, 32])]


# host descriptors read q rows past a chunk's end (NaN padding): rows never stored
@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")
@pytest.mark.parametrize("config", WS_TILE_CONFIGS, ids=config_label)
@pytest.mark.parametrize(("q_lens", "ctx_lens"), WS_TILE_CASES, ids=["one", "short", "prefixes"])
def test_dense_prefill_ws_nan_buffers(monkeypatch, config, q_lens, ctx_lens):
    # out, the lse scratch and the padding tokens' q/k/v (two tokens after the last chunk) all
    # NaN before the call: nothing but the real rows may reach a result, every real row written
    calls = _spy_ws(monkeypatch)
    _nan_lse_scratch(monkeypatch)
    shape = dict(num_heads=8, num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.bfloat16)
    q, k, v, k_cache, v_cache, meta, n = _case(q_lens, ctx_lens, **shape, seed=sum(ctx_lens) + 1)
    qkv = torch.cat([q, k, v], dim=1)  # the engine's fused projection, sliced into views
    qkv[n:] = float("nan")
    q, k, v = qkv.split([8, 2, 2], dim=1)
    ref = dense_prefill_attention_ref(q, k, v, k_cache, v_cache, *meta, 0.125)
    out = nan_like(q)
    dense_prefill_attention(q, k, v, k_cache, v_cache, *meta, 0.125, out=out, config=config)
    assert calls == [config]
    assert not out[:n].isnan().any(), "NaN (or an unwritten row) in a real token"
    assert_close(out[:n], ref[:n], torch.bfloat16)
    assert out[n:].isnan().all(), "padding tokens were written"


# On an H200 the non-warp-specialized kernel with 16-key tiles gives NaN for the two rows whose
# q.k overflows float32 (32- and 64-key tiles, the warp-specialized kernel and the interpreter
# give the reference's -inf): the 16-wide dot's accumulation meets the infinity differently.
# No real score comes near 3e38, and no shipped non-warp-specialized tile has 16 keys; strict,
# so a Triton that changes it shows up here.
SMALL_OVERFLOW = pytest.param(
    SMALL,
    marks=pytest.mark.xfail(
        ON_GPU, reason="sm_90: an overflowing score in a 16-key tile is NaN", strict=True
    ),
)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy: overflow, log2(0)
@pytest.mark.parametrize(
    "config",
    [None, SMALL_OVERFLOW, SMALL_WS, SMALL_WS_HOST],
    ids=lambda c: config_label(c) if c else "default",
)
def test_dense_prefill_row_without_visible_chunk_key(config):
    # A query row for which every key of its own chunk scores -inf (q.k overflows float32), so
    # the chunk kernel of the warp-specialized variant meets a row with no visible key at all:
    # it must give that row p = 0, l = 0 (not exp2(-inf - -inf) = NaN) and a log-sum-exp of
    # -inf, which the merge turns into attention over the cached prefix alone (the reference's
    # softmax: chunk keys of weight 0). Other rows: finite scores of the usual size. (They must
    # not weigh the huge dimension: a score near 1e20 is rounded differently by every dot, so
    # the softmax of "equal" keys would depend on summation order, not on the kernel.)
    shape = dict(num_heads=4, num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.bfloat16)
    q, k, v, k_cache, v_cache, meta, n = _case([40], [19], **shape, seed=12)
    k[:n, :, 0] = -1e20  # one dimension of every chunk key; into the cache too (the ref reads it)
    q[:, :, 0] = 0  # which the other rows leave out
    block_tables = meta[0]
    for p in range(40):
        blk, slot = int(block_tables[0, (19 + p) // 16]), (19 + p) % 16
        k_cache[blk, slot] = k[p]
    q[7, 1], q[33, 3] = 1e20, 1e20  # rows whose chunk keys all score -inf; the rest keep q
    ref = dense_prefill_attention_ref(q, k, v, k_cache, v_cache, *meta, 0.125)
    assert ref[:n].isfinite().all()
    out = dense_prefill_attention(q, k, v, k_cache, v_cache, *meta, 0.125, config=config)
    assert not out[:n].isnan().any()
    assert_close(out[:n], ref[:n], torch.bfloat16)


@pytest.mark.parametrize("alignment", [0, 1, 16, 128, 1024])
def test_ws_scratch_alignment(alignment):
    # the allocator behind in-kernel descriptors honours the alignment Triton asks for
    for size in (1, 384, 4096 + 3):
        buf = ws_mod._aligned_bytes(size, alignment, DEVICE)
        assert buf.numel() == size and buf.dtype == torch.int8
        assert buf.data_ptr() % max(1, alignment) == 0


@pytest.mark.parametrize("case", ["fp8_cache", "k_heads", "k_tokens", "k_dtype", "v_last_dim"])
def test_dense_prefill_rejects_bad_inputs(case):
    shape = dict(num_heads=4, num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.float32)
    q, k, v, k_cache, v_cache, meta, _ = _case([5, 4], [0, 3], **shape, seed=5)
    if case == "fp8_cache":
        k_cache, v_cache = k_cache.to(torch.float8_e4m3fn), v_cache.to(torch.float8_e4m3fn)
    elif case == "k_heads":
        k = k[:, :1]
    elif case == "k_tokens":
        k = k[:-1]
    elif case == "k_dtype":
        k = k.double()
    elif case == "v_last_dim":
        v = v.transpose(1, 2).contiguous().transpose(1, 2)
    with pytest.raises(ValueError):
        dense_prefill_attention(q, k, v, k_cache, v_cache, *meta, 0.125)


def test_dense_prefill_no_queries():
    shape = dict(num_heads=2, num_kv_heads=1, head_dim=64, block_size=16, dtype=torch.float32)
    q, k, v, k_cache, v_cache, (bt, _, _, _), _ = _case([3], [0], **shape, seed=6)
    out = nan_like(q)
    dense_prefill_attention(
        q, k, v, k_cache, v_cache, bt, int_tensor([0]), int_tensor([0, 0]), 0, 0.1, out=out
    )
    assert out.isnan().all()


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (real bf16 wgmma, the copy engine)")
@pytest.mark.parametrize("config", [None, *CONFIGS_TO_SWEEP, *CONFIGS_WARP_SPEC], ids=str)
def test_dense_prefill_gpu_bf16_llama_shapes(config):
    # Llama-3.1-8B attention (32 q / 8 kv heads, d 128, block 16): a long new prompt, chunks
    # over cached prefixes, a one-token row; and the paged kernel agrees with it
    shape = dict(num_heads=32, num_kv_heads=8, head_dim=128, block_size=16, dtype=torch.bfloat16)
    q, k_cache, v_cache, meta, ref, n = _check(
        [2048, 300, 1, 513], [0, 1000, 77, 0], config, **shape, seed=7
    )
    paged = paged_prefill_attention(q, k_cache, v_cache, *meta, 128**-0.5)
    assert_close(paged[:n], ref[:n], torch.bfloat16)
