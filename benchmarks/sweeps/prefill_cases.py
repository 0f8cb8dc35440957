"""What benchmarks/sweeps/prefill_sweep.py measures and how: the dense prefill attention variants
(labels -> PrefillConfig), their inputs (q/k/v views of one fused qkv buffer, a shuffled paged
cache), the torch reference and the check against it, the CUDA-event timer, and FLOP counts.
Imports only torch and kernels.*; used by the sweep's process and its probe children.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]

TARGET_PCT = 70.0
FINALISTS = 3  # fastest variants timed on the other shapes, beside the default
MAX_ABS = 0.0625  # bf16 outputs: the kernels so far are 0.016 off the fp32-math reference
REL_L2 = 2e-2
SHAPE_8K = (1, 0, 8192)  # (sequences, cached prefix, chunk)
OTHER_SHAPES = [(1, 0, 4096), (4, 0, 2048), (16, 0, 512), (4, 3584, 512), (16, 1024, 128),
                (1, 16384, 8192)]  # fmt: skip
DIMS = (32, 8, 128, 16)  # query heads, KV heads, head_dim, KV block size
SMOKE_8K, SMOKE_OTHER, SMOKE_DIMS = (1, 0, 80), [(2, 0, 40), (2, 24, 16)], (4, 2, 64, 16)


def _dense():
    """kernels.dense_prefill_attention, imported late: TRITON_INTERPRET must be set first."""
    from kernels import dense_prefill_attention

    return dense_prefill_attention


def variants(smoke: bool) -> dict[str, Any]:
    """label -> PrefillConfig (None: the launcher's default)."""
    dense = _dense()
    if smoke:
        small = dense.PrefillConfig(32, 16, 4, 2)
        configs = [small, small._replace(tma=True), small._replace(warp_spec=True)]
    else:
        configs = dense.CONFIGS_TO_SWEEP + dense.CONFIGS_WARP_SPEC
    return {"default": None, **{dense.config_label(c): c for c in configs}}


def shape_label(shape: tuple[int, int, int]) -> str:
    n, prefix, q_len = shape
    return f"{n}x{q_len}" + (f" +prefix {prefix}" if prefix else "")


def make_inputs(shape, dims, device, seed: int = 0) -> dict[str, Any]:
    """n chunks of q_len tokens after `prefix` cached ones: q/k/v views of one fused qkv buffer
    [n * q_len, H + 2 Hkv, D] (the engine's), a shuffled paged cache holding the random prefix
    and the chunk's k/v (as store_kv leaves it), int32 metadata."""
    (n, prefix, q_len), (H, Hkv, D, bs) = shape, dims
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*size):
        return torch.empty(size, dtype=torch.bfloat16, device=device).normal_(generator=g)

    qkv = randn(n * q_len, H + 2 * Hkv, D)
    q, k, v = qkv.split([H, Hkv, Hkv], dim=1)
    seq_len, per_seq = prefix + q_len, -(-(prefix + q_len) // bs)
    k_cache, v_cache = randn(n * per_seq, bs, Hkv, D), randn(n * per_seq, bs, Hkv, D)
    table = torch.randperm(n * per_seq, device=device, generator=g).view(n, per_seq).int()
    slots = (table.long()[:, :, None] * bs + torch.arange(bs, device=device)).flatten(1)
    slots = slots[:, prefix:seq_len].flatten()
    k_cache.view(-1, Hkv, D)[slots] = k
    v_cache.view(-1, Hkv, D)[slots] = v
    seq_lens = torch.full((n,), seq_len, dtype=torch.int32, device=device)
    qsl = torch.arange(n + 1, dtype=torch.int32, device=device) * q_len
    args = (q, k, v, k_cache, v_cache, table, seq_lens, qsl, q_len, D**-0.5)
    return {"shape": shape, "args": args, "out": torch.empty_like(q)}


def runner(label: str, cfg, inp: dict[str, Any]):
    """A no-argument call of variant `label` writing inp['out'] (and returning it)."""
    q, k, v, k_cache, v_cache, table, seq_lens, qsl, max_q, scale = inp["args"]
    out = inp["out"]
    if label == "paged":
        from kernels.paged_prefill_attention import paged_prefill_attention

        return lambda: paged_prefill_attention(
            q, k_cache, v_cache, table, seq_lens, qsl, max_q, scale, out=out
        )
    if label == "sdpa":  # flash on dense K/V pre-expanded to every query head (prefix-free)
        import torch.nn.functional as F

        n, L, group = seq_lens.shape[0], max_q, q.shape[1] // k.shape[1]
        qd, kd, vd = (t.unflatten(0, (n, L)).transpose(1, 2) for t in (q, k, v))
        qd = qd.contiguous()
        kd = kd.repeat_interleave(group, dim=1).contiguous()
        vd = vd.repeat_interleave(group, dim=1).contiguous()
        return lambda: F.scaled_dot_product_attention(qd, kd, vd, is_causal=True)
    dense = _dense()
    return lambda: dense.dense_prefill_attention(*inp["args"], out=out, config=cfg)


def reference(inp: dict[str, Any], rows: int | None) -> list[tuple[slice, torch.Tensor]]:
    """(token rows, reference output) pairs: every row (rows=None), or the first and the last
    `rows` queries of each sequence (the paged fp32 reference run on those queries only)."""
    from kernels.paged_prefill_attention import paged_prefill_attention_ref

    q, _, _, k_cache, v_cache, table, seq_lens, qsl, max_q, scale = inp["args"]
    if rows is None:
        return [(slice(None), paged_prefill_attention_ref(q, k_cache, v_cache, table, seq_lens,
                                                          qsl, max_q, scale))]  # fmt: skip
    n, prefix, q_len = inp["shape"]
    pieces = []
    for i in range(n):
        for a, b in {(0, min(rows, q_len)), (max(0, q_len - rows), q_len)}:
            tok = slice(i * q_len + a, i * q_len + b)
            lens = torch.tensor([prefix + b], dtype=torch.int32, device=q.device)
            loc = torch.tensor([0, b - a], dtype=torch.int32, device=q.device)
            ref = paged_prefill_attention_ref(q[tok], k_cache, v_cache, table[i : i + 1], lens,
                                              loc, b - a, scale)  # fmt: skip
            pieces.append((tok, ref))
    return pieces


def check(out: torch.Tensor, refs) -> dict[str, Any]:
    """out (NaN before the call, every row a real query) against the reference rows."""
    got = torch.cat([out[tok].float().flatten() for tok, _ in refs])
    want = torch.cat([ref.float().flatten() for _, ref in refs])
    diff = (got - want).abs()
    max_abs, rel = diff.max().item(), (diff.norm() / want.norm().clamp_min(1e-30)).item()
    finite = bool(torch.isfinite(out).all())  # rows outside the checked ones were written too
    ok = finite and max_abs <= MAX_ABS and rel <= REL_L2
    return {"max_abs": max_abs, "rel_l2": rel, "all_rows_finite": finite, "ok": ok}


def time_ms(fn, min_reps: int = 20, min_total_ms: float = 100.0) -> float:
    """Median of >= min_reps calls, each between CUDA events after an L2 flush, after warm-up."""
    if not torch.cuda.is_available():  # interpreter smoke run: one call, wall clock
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    estimate = (time.perf_counter() - t0) * 1e3 / 3
    reps = max(min_reps, int(min_total_ms / max(estimate, 1e-3)))
    for _ in range(max(2, int(25 / max(estimate, 1e-3)))):  # ~25 ms of warm-up
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]  # fmt: skip
    for start, end in events:
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return float(torch.tensor([s.elapsed_time(e) for s, e in events]).median())


def cuda_graph_of(fn) -> torch.cuda.CUDAGraph:
    """fn captured in a CUDA graph, after one eager call (compiles and cuBLAS heuristics run
    outside the capture)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def graph_time_ms(fn) -> float:
    """time_ms of fn replayed as a CUDA graph (no host launch time in the figure); without a GPU
    (interpreter smoke runs) fn itself."""
    if not torch.cuda.is_available():
        return time_ms(fn)
    return time_ms(cuda_graph_of(fn).replay)


def flops(shape, dims) -> float:
    """QK^T and PV of n causal chunks of q_len queries after `prefix` cached keys."""
    (n, prefix, q_len), (H, _, D, _) = shape, dims
    return 4.0 * n * (q_len * (prefix + 1) + q_len * (q_len - 1) // 2) * H * D
