"""Runs the kernel bench's sections in order and writes its report; `main` takes the command
line (the package docstring is its usage)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from benchmarks import kernel_bench
from benchmarks.kernel_bench import decode, elementwise, fp8, prefill
from benchmarks.kernel_bench.harness import Bench, Case


def run(bench: Bench, only: set[str] | None) -> dict[str, Any]:
    t0 = time.perf_counter()
    name = torch.cuda.get_device_name() if bench.cuda else "cpu (TRITON_INTERPRET)"
    print(
        f"device: {name} | torch {torch.__version__} | triton {bench.triton.__version__}"
        + (" | SMOKE (tiny shapes, wall-clock single runs)" if bench.smoke else "")
    )
    bench.measure_peaks()
    bench.print_header()
    sections = {
        "decode": decode.bench_decode,
        "decode_splits": decode.bench_decode_splits,
        "prefill": prefill.bench_prefill,
        "prefill_8k": prefill.bench_prefill_8k,
        "prefill_split": prefill.bench_prefill_split,
        "elementwise": elementwise.bench_elementwise,
        "skinny_gemm": fp8.bench_skinny_gemm,
        "fp8": fp8.bench_fp8,
        "prefill_sweep": prefill.bench_prefill_sweep,
    }
    opt_in = {"prefill_sweep"}  # long: only when --only names it
    for key, fn in sections.items():
        if (only and key not in only) or (not only and key in opt_in):
            continue
        try:
            fn(bench)
        except Exception as e:  # a broken section must not hide the others
            traceback.print_exc()
            bench.cases.append(Case(key, {}, error=f"{type(e).__name__}: {e}"))
    elapsed = time.perf_counter() - t0
    print(f"done in {elapsed:.1f}s")
    return {
        "device": name,
        "torch": torch.__version__,
        "triton": bench.triton.__version__,
        "smoke": bench.smoke,
        "dtype": str(bench.dtype),
        "timing": "triton.testing.do_bench median" if bench.cuda else "wall clock, 1 run",
        "copy_GBps": bench.copy_gbps,
        "matmul_bf16_TFLOPs": bench.matmul_tflops,
        "elapsed_s": elapsed,
        "prefill_8k": bench.prefill_8k,
        "prefill_sweep": bench.prefill_sweep,
        "results": [c.as_dict() for c in bench.cases],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.kernel_bench", description=kernel_bench.__doc__.split("\n\n")[0]
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (runs on CPU too)")
    parser.add_argument(
        "--only",
        default="",
        help="comma list of sections: decode,decode_splits,prefill,prefill_8k,prefill_split,"
        "elementwise,fp8,prefill_sweep (opt-in)",
    )
    parser.add_argument("--warmup-ms", type=int, default=25)
    parser.add_argument("--rep-ms", type=int, default=100)
    args = parser.parse_args(argv)

    if not torch.cuda.is_available():
        if not args.smoke:
            print("no CUDA device: run with --smoke for the interpreter check", file=sys.stderr)
            return 2
        # must precede the first import of the kernels (decided when @triton.jit runs)
        os.environ.setdefault("TRITON_INTERPRET", "1")

    only = {s.strip() for s in args.only.split(",") if s.strip()} or None
    bench = Bench(args.smoke, args.warmup_ms, args.rep_ms)
    report = run(bench, only)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str))
        print(f"wrote {args.json}")
    failed = [r for r in report["results"] if r["error"] or not r["check"].get("ok", True)]
    for r in failed:
        print(f"FAILED: {r['kernel']} {r['config']} {r['error'] or r['check']}", file=sys.stderr)
    return 1 if failed else 0
