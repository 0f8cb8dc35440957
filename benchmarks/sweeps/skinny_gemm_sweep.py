# Which tiles and K splits make kernels/skinny_gemm.py fastest at the decode step's shapes, and
# is it faster than cuBLAS there? For each projection of a model (q/k/v, o, gate/up, down,
# lm_head) and batch rows M, every candidate config and F.linear (cuBLAS) are timed as CUDA
# graphs of LAYERS calls over distinct weight copies (as the layers of a decode step: each
# weight cold, read once), after an L2 flush; each Triton config is checked against F.linear
# first. Reports per-call ms, the weight-streaming rate against the measured copy ceiling, the
# best config per shape and cuBLAS beside it.
#   python -m benchmarks.sweeps.skinny_gemm_sweep --json out.json [--ms 1,16,32,64,128]
#       [--workers 14] [--model llama-3.1-70b] [--fp8]
# Compiles run first in a pool of processes (Triton's disk cache then serves the timing process).
from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import time
from pathlib import Path

import torch

from benchmarks.sweeps.prefill_cases import cuda_graph_of, time_ms
from kernels import skinny_gemm as sg

# one GPU: (name, N, K) per model
MODEL_SHAPES = {
    "llama-3.1-8b": [
        ("qkv", 6144, 4096),
        ("o", 4096, 4096),
        ("gate_up", 28672, 4096),
        ("down", 4096, 14336),
        ("lm_head", 128256, 4096),
    ],
    "llama-3.1-70b": [
        ("qkv", 10240, 8192),
        ("o", 8192, 8192),
        ("gate_up", 57344, 8192),
        ("down", 8192, 28672),
        ("lm_head", 128256, 8192),
    ],
}
SHAPES = MODEL_SHAPES["llama-3.1-8b"]
MS = (1, 8, 16, 32, 64, 96, 128, 192, 256)
LAYERS = 8  # distinct weights per graph (lm_head: 2)
SMEM = 220 * 1024
# the candidate grid: block_n, block_k, split_k, num_stages, num_warps (--grid overrides)
GRID = {"bn": (64, 128), "bk": (64, 128, 256), "split": (1, 2, 4, 8), "stages": (3, 5),
        "warps": (4, 8)}  # fmt: skip
# --fp8: e4m3 weights. "w8a16" widens them in registers (bf16 x); "w8a8" quantizes x per row
# first (kernels/fp8_quant.py, inside the timed call) and runs an e4m3 dot. The baseline is the
# engine's other path: that quantization + torch._scaled_mm.
FP8_GRID = {"bn": (64, 128), "bk": (128, 256, 512), "split": (1, 2, 4, 8), "stages": (3, 5),
            "warps": (4, 8)}  # fmt: skip
W_BYTES = {"bf16": 2, "w8a16": 1, "w8a8": 1}
X_BYTES = {"bf16": 2, "w8a16": 2, "w8a8": 1}


def candidates(m: int, n: int, k: int, mode: str = "bf16") -> list[sg.SkinnyConfig]:
    grid = GRID if mode == "bf16" else FP8_GRID
    bm = sg.block_m_for(m)
    m_tiles = -(-m // bm)
    out = []
    for bn, bk, split, stages, warps in itertools.product(
        grid["bn"], grid["bk"], grid["split"], grid["stages"], grid["warps"]
    ):
        if warps == 8 and bn == 64 and bm < 128:
            continue
        if bn * bm > warps * 32 * 128:
            continue  # the float32 accumulator would take > 128 registers a thread
        stage_bytes = (bn * W_BYTES[mode] + bm * X_BYTES[mode]) * bk
        if stage_bytes * stages > SMEM or k % (split * bk) or k // split < 2 * bk:
            continue
        programs = -(-n // bn) * split * m_tiles
        if programs < 64 or programs > 4096:
            continue
        out.append(sg.SkinnyConfig(bn, bk, split, warps, stages))
    return out


def modes_for(m: int, fp8: bool) -> list[str]:
    if not fp8:
        return ["bf16"]
    return ["w8a16", "w8a8"] if m >= 32 else ["w8a16"]


def tasks(ms, fp8: bool = False) -> list[tuple[int, int, int, sg.SkinnyConfig, str]]:
    return [
        (m, n, k, c, mode)
        for _, n, k in SHAPES
        for m in ms
        for mode in modes_for(m, fp8)
        for c in candidates(m, n, k, mode)
    ]


def operands_for(mode: str, m: int, n: int, k: int, gen=None):
    """(x, w, w_scale) on the GPU for one mode; random when gen is given, else zeros."""
    if gen is None:
        x = torch.zeros(m, k, dtype=torch.bfloat16, device="cuda")
        w = torch.zeros(n, k, dtype=torch.bfloat16, device="cuda")
    else:
        x = torch.randn(m, k, device="cuda", generator=gen, dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", generator=gen, dtype=torch.bfloat16) / k**0.5
    if mode == "bf16":
        return x, w, None
    from engine.models.fp8 import quantize_weight

    w_q, w_scale = quantize_weight(w)
    return x, w_q, w_scale


def run_mode(mode: str, x, w, w_scale, out, cfg) -> None:
    if mode == "bf16":
        sg.skinny_gemm(x, w, out=out, config=cfg)
    elif mode == "w8a16":
        sg.skinny_gemm(x, w, w_scale=w_scale, out=out, config=cfg)
    else:
        from kernels.fp8_quant import quantize_fp8

        x_q, x_scale = quantize_fp8(x)
        sg.skinny_gemm(x_q, w, w_scale=w_scale, x_scale=x_scale, out_dtype=x.dtype, out=out,
                       config=cfg)  # fmt: skip


def baseline(mode: str, x, w, w_scale, out) -> None:
    if mode == "bf16":
        torch.matmul(x, w.T, out=out)
    else:
        from kernels.fp8_quant import quantize_fp8

        x_q, x_scale = quantize_fp8(x)
        out.copy_(torch._scaled_mm(x_q, w.t(), scale_a=x_scale, scale_b=w_scale[None, :],
                                   out_dtype=x.dtype))  # fmt: skip


def _compile(chunk) -> int:
    torch.cuda.init()
    failed, operands = 0, {}
    for m, n, k, cfg, mode in chunk:
        if (n, k, mode) not in operands:
            operands[(n, k, mode)] = operands_for(mode, 1, n, k)[1:]
        w, w_scale = operands[(n, k, mode)]
        x = torch.zeros(m, k, dtype=torch.bfloat16, device="cuda")
        out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        try:
            run_mode(mode, x, w, w_scale, out, cfg)
        except Exception:  # reported by the timing pass
            failed += 1
    torch.cuda.synchronize()
    return failed


def precompile(ms, workers: int, fp8: bool = False) -> None:
    todo = tasks(ms, fp8)
    # one key per compiled variant: block_m, the config's constexprs, K's specialisation (the
    # kernel does not specialise on m)
    seen, uniq = set(), []
    for m, n, k, c, mode in todo:
        key = (sg.block_m_for(m), c, mode, n % c.block_n == 0, (k // c.split_k) % 16)
        if key not in seen:
            seen.add(key)
            uniq.append((m, n, k, c, mode))
    t0 = time.perf_counter()
    chunks = [uniq[i::workers] for i in range(workers)]
    with mp.get_context("spawn").Pool(workers) as pool:
        failed = sum(pool.map(_compile, chunks))
    print(
        f"precompiled {len(uniq)} variants in {time.perf_counter() - t0:.0f} s ({failed} failed)",
        flush=True,
    )


def sweep_shape(name, n, k, ms, copy_bytes_s, gen, fp8: bool = False) -> list[dict]:
    layers = 2 if n * k > 1e8 else LAYERS
    mode0 = "w8a16" if fp8 else "bf16"
    weights = [operands_for(mode0, 1, n, k, gen)[1:] for _ in range(layers)]
    rows = []
    for m in ms:
        x = torch.randn(m, k, device="cuda", generator=gen, dtype=torch.bfloat16)
        outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
        w0, s0 = weights[0]
        ref = sg.skinny_gemm_ref(x, w0, s0).float()
        floor_ms = n * k * W_BYTES[mode0] / copy_bytes_s * 1e3

        def base(x=x, outs=outs):
            for (w, ws), o in zip(weights, outs):
                baseline(mode0, x, w, ws, o)

        cublas_ms = time_ms(cuda_graph_of(base).replay, 10, 30.0) / layers
        results = []
        for mode in modes_for(m, fp8):
            for cfg in candidates(m, n, k, mode):
                try:
                    run_mode(mode, x, w0, s0, outs[0], cfg)
                    err = (outs[0].float() - ref).abs().max().item()
                    if err > 0.05 * ref.abs().max().item() + 1e-2:
                        results.append(
                            {"config": cfg_dict(cfg, mode), "error": f"max abs err {err:.3g}"}
                        )
                        continue

                    def run(cfg=cfg, x=x, outs=outs, mode=mode):
                        for (w, ws), o in zip(weights, outs):
                            run_mode(mode, x, w, ws, o, cfg)

                    ms_ = time_ms(cuda_graph_of(run).replay, 10, 30.0) / layers
                    results.append({"config": cfg_dict(cfg, mode), "ms": ms_})
                except Exception as e:  # a config that does not compile is a result
                    results.append(
                        {"config": cfg_dict(cfg, mode), "error": f"{type(e).__name__}: {e}"[:200]}
                    )
        timed = sorted((r for r in results if "ms" in r), key=lambda r: r["ms"])
        best = timed[0] if timed else None
        default = sg.default_config(m, n, k, w_bytes=W_BYTES[mode0])
        default_ms = next((r["ms"] for r in timed if r["config"] == cfg_dict(default, mode0)), None)
        row = {
            "shape": name, "m": m, "n": n, "k": k, "floor_ms": floor_ms, "fp8": fp8,
            "cublas_ms": cublas_ms, "cublas_of_copy": floor_ms / cublas_ms,
            "best": best, "best_of_copy": floor_ms / best["ms"] if best else None,
            "speedup": cublas_ms / best["ms"] if best else None,
            "default": cfg_dict(default, mode0), "default_ms": default_ms,
            "top": timed[:8], "errors": [r for r in results if "error" in r][:5],
            "num_candidates": len(results),
        }  # fmt: skip
        rows.append(row)
        b = "-"
        if best:
            b = f"{best['ms'] * 1e3:7.1f} us {row['best_of_copy']:5.1%} {best['config']}"
        d = f" default {default_ms * 1e3:.1f} us" if default_ms else ""
        base_name = "scaled_mm" if fp8 else "cuBLAS"
        print(
            f"{name:8s} M={m:4d}  {base_name} {cublas_ms * 1e3:7.1f} us "
            f"{row['cublas_of_copy']:5.1%}"
            f"  best {b}  x{row['speedup'] or 0:.2f}{d}",
            flush=True,
        )
    return rows


def cfg_dict(c: sg.SkinnyConfig, mode: str = "bf16") -> dict:
    return {"bn": c.block_n, "bk": c.block_k, "split": c.split_k, "warps": c.num_warps,
            "stages": c.num_stages, "mode": mode}  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--shapes", default="qkv,o,gate_up,down,lm_head")
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--grid", help='JSON overriding parts of GRID, e.g. {"bn": [128, 256]}')
    ap.add_argument("--model", default="llama-3.1-8b", choices=sorted(MODEL_SHAPES))
    ap.add_argument("--fp8", action="store_true", help="e4m3 weights (W8A16 / W8A8)")
    args = ap.parse_args(argv)
    if args.grid:
        (FP8_GRID if args.fp8 else GRID).update(
            {k: tuple(v) for k, v in json.loads(args.grid).items()}
        )
    if not torch.cuda.is_available():
        print("needs a GPU")
        return 1
    ms = [int(v) for v in args.ms.split(",")]
    global SHAPES
    SHAPES = [s for s in MODEL_SHAPES[args.model] if s[0] in args.shapes.split(",")]
    from fleetlm.bench.roofline_check import measure_ceilings

    ceilings = measure_ceilings()
    print(f"ceilings {ceilings}", flush=True)
    if args.workers > 0:
        precompile(ms, args.workers, args.fp8)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    rows = []
    for name, n, k in SHAPES:
        rows += sweep_shape(name, n, k, ms, ceilings["copy_bytes_s"], gen, args.fp8)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "device": torch.cuda.get_device_name(),
                    "ceilings": ceilings,
                    "rows": rows,
                    "model": args.model,
                    "fp8": args.fp8,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
