# Which tiles and K splits make kernels/skinny_gemm.py fastest at the decode step's shapes, and
# is it faster than cuBLAS there? For each projection of a model (q/k/v, o, gate/up, down,
# lm_head) and batch rows M, every candidate config and F.linear (cuBLAS) are timed as CUDA
# graphs of LAYERS calls over distinct weight copies (as the layers of a decode step: each
# weight cold, read once), after an L2 flush; each Triton config is checked against F.linear
# first. Reports per-call ms, the weight-streaming rate against the measured copy ceiling, the
# best config per shape and cuBLAS beside it.
#   python benchmarks/skinny_gemm_sweep.py --json out.json [--ms 1,16,32,64,128] [--workers 14]
# Compiles run first in a pool of processes (Triton's disk cache then serves the timing process).
from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.prefill_cases import cuda_graph_of, time_ms
from kernels import skinny_gemm as sg

# llama-3.1-8b, one GPU: (name, N, K)
SHAPES = [
    ("qkv", 6144, 4096),
    ("o", 4096, 4096),
    ("gate_up", 28672, 4096),
    ("down", 4096, 14336),
    ("lm_head", 128256, 4096),
]
MS = (1, 8, 16, 32, 64, 96, 128, 192, 256)
LAYERS = 8  # distinct weights per graph (lm_head: 2)
SMEM = 220 * 1024
# the candidate grid: block_n, block_k, split_k, num_stages, num_warps (--grid overrides)
GRID = {"bn": (64, 128), "bk": (64, 128, 256), "split": (1, 2, 4, 8), "stages": (3, 5),
        "warps": (4, 8)}  # fmt: skip


def candidates(m: int, n: int, k: int) -> list[sg.SkinnyConfig]:
    bm = sg.block_m_for(m)
    m_tiles = -(-m // bm)
    out = []
    for bn, bk, split, stages, warps in itertools.product(
        GRID["bn"], GRID["bk"], GRID["split"], GRID["stages"], GRID["warps"]
    ):
        if warps == 8 and bn == 64 and bm < 128:
            continue
        if bn * bm > warps * 32 * 128:
            continue  # the float32 accumulator would take > 128 registers a thread
        if (bn + bm) * bk * 2 * stages > SMEM or k % (split * bk) or k // split < 2 * bk:
            continue
        programs = -(-n // bn) * split * m_tiles
        if programs < 64 or programs > 4096:
            continue
        out.append(sg.SkinnyConfig(bn, bk, split, warps, stages))
    return out


def tasks(ms) -> list[tuple[int, int, int, sg.SkinnyConfig]]:
    return [(m, n, k, c) for _, n, k in SHAPES for m in ms for c in candidates(m, n, k)]


def _compile(chunk) -> int:
    torch.cuda.init()
    failed, weights = 0, {}
    for m, n, k, cfg in chunk:
        x = torch.zeros(m, k, dtype=torch.bfloat16, device="cuda")
        if (n, k) not in weights:
            weights[(n, k)] = torch.zeros(n, k, dtype=torch.bfloat16, device="cuda")
        w = weights[(n, k)]
        try:
            sg.skinny_gemm(x, w, config=cfg)
        except Exception:  # reported by the timing pass
            failed += 1
    torch.cuda.synchronize()
    return failed


def precompile(ms, workers: int) -> None:
    todo = tasks(ms)
    # one key per compiled variant: block_m, the config's constexprs, K's specialisation (the
    # kernel does not specialise on m)
    seen, uniq = set(), []
    for m, n, k, c in todo:
        key = (sg.block_m_for(m), c, n % c.block_n == 0, (k // c.split_k) % 16)
        if key not in seen:
            seen.add(key)
            uniq.append((m, n, k, c))
    t0 = time.perf_counter()
    chunks = [uniq[i::workers] for i in range(workers)]
    with mp.get_context("spawn").Pool(workers) as pool:
        failed = sum(pool.map(_compile, chunks))
    print(
        f"precompiled {len(uniq)} variants in {time.perf_counter() - t0:.0f} s ({failed} failed)",
        flush=True,
    )


def sweep_shape(name, n, k, ms, copy_bytes_s, gen) -> list[dict]:
    layers = 2 if n * k > 1e8 else LAYERS
    ws = [torch.randn(n, k, device="cuda", generator=gen, dtype=torch.bfloat16) / k**0.5
          for _ in range(layers)]  # fmt: skip
    rows = []
    for m in ms:
        x = torch.randn(m, k, device="cuda", generator=gen, dtype=torch.bfloat16)
        outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
        ref = torch.nn.functional.linear(x, ws[0]).float()
        floor_ms = n * k * 2 / copy_bytes_s * 1e3

        def cublas(x=x, outs=outs):
            for w, o in zip(ws, outs):
                torch.matmul(x, w.T, out=o)

        cublas_ms = time_ms(cuda_graph_of(cublas).replay, 10, 30.0) / layers
        results = []
        for cfg in candidates(m, n, k):
            try:
                sg.skinny_gemm(x, ws[0], out=outs[0], config=cfg)
                err = (outs[0].float() - ref).abs().max().item()
                if err > 0.05 * ref.abs().max().item() + 1e-2:
                    results.append({"config": cfg_dict(cfg), "error": f"max abs err {err:.3g}"})
                    continue

                def run(cfg=cfg, x=x, outs=outs):
                    for w, o in zip(ws, outs):
                        sg.skinny_gemm(x, w, out=o, config=cfg)

                ms_ = time_ms(cuda_graph_of(run).replay, 10, 30.0) / layers
                results.append({"config": cfg_dict(cfg), "ms": ms_})
            except Exception as e:  # a config that does not compile is a result
                results.append({"config": cfg_dict(cfg), "error": f"{type(e).__name__}: {e}"[:200]})
        timed = sorted((r for r in results if "ms" in r), key=lambda r: r["ms"])
        best = timed[0] if timed else None
        row = {
            "shape": name, "m": m, "n": n, "k": k, "floor_ms": floor_ms,
            "cublas_ms": cublas_ms, "cublas_of_copy": floor_ms / cublas_ms,
            "best": best, "best_of_copy": floor_ms / best["ms"] if best else None,
            "speedup": cublas_ms / best["ms"] if best else None,
            "top": timed[:8], "errors": [r for r in results if "error" in r][:5],
            "num_candidates": len(results),
        }  # fmt: skip
        rows.append(row)
        b = "-"
        if best:
            b = f"{best['ms'] * 1e3:7.1f} us {row['best_of_copy']:5.1%} {best['config']}"
        print(
            f"{name:8s} M={m:4d}  cuBLAS {cublas_ms * 1e3:7.1f} us {row['cublas_of_copy']:5.1%}"
            f"  best {b}  x{row['speedup'] or 0:.2f}",
            flush=True,
        )
    return rows


def cfg_dict(c: sg.SkinnyConfig) -> dict:
    return {"bn": c.block_n, "bk": c.block_k, "split": c.split_k, "warps": c.num_warps,
            "stages": c.num_stages}  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--shapes", default="qkv,o,gate_up,down,lm_head")
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--grid", help='JSON overriding parts of GRID, e.g. {"bn": [128, 256]}')
    args = ap.parse_args(argv)
    if args.grid:
        GRID.update({k: tuple(v) for k, v in json.loads(args.grid).items()})
    if not torch.cuda.is_available():
        print("needs a GPU")
        return 1
    ms = [int(v) for v in args.ms.split(",")]
    global SHAPES
    SHAPES = [s for s in SHAPES if s[0] in args.shapes.split(",")]
    from fleetlm.bench.roofline_check import measure_ceilings

    ceilings = measure_ceilings()
    print(f"ceilings {ceilings}", flush=True)
    if args.workers > 0:
        precompile(ms, args.workers)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    rows = []
    for name, n, k in SHAPES:
        rows += sweep_shape(name, n, k, ms, ceilings["copy_bytes_s"], gen)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"device": torch.cuda.get_device_name(), "ceilings": ceilings, "rows": rows},
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
