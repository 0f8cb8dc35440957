"""One-shot sweep of the dense prefill attention variants (issue 15, item 4: >= 70 % of the bf16
matmul ceiling on 1 x 8192 causal, Llama-3.1-8B heads, q/k/v views of one fused qkv buffer).

    PYTHONPATH=$PWD python3 -m benchmarks.kernel_bench --only prefill_sweep --json OUT.json
    PYTHONPATH=$PWD python3 -m benchmarks.sweeps.prefill_sweep --json OUT.json   # the same
    python3 -m benchmarks.kernel_bench --only prefill_sweep --smoke        # CPU, TRITON_INTERPRET

1. Probe: every variant is launched once on 1 x 8192 in a child process of its own, several at
   a time. A compiler crash, a launch error or a hang fails that variant only (reported, never
   the sweep), and the children fill the Triton cache the timing process then loads from.
2. In this process each surviving variant is checked against the torch reference on its whole
   output (max abs error and relative L2 error), then timed: CUDA events around each call, L2
   flushed before it, warm-up, median of >= 20 calls. The matmul ceiling comes from the same run
   (kernel_bench's Bench.measure_peaks); PyTorch SDPA (flash) and the paged kernel for reference.
3. The default, the FINALISTS fastest and the fastest of each family (warp-specialized or not)
   are probed, checked (first and last rows of every sequence, every row finite) and timed on
   the other shapes of docs/benchmarks-log.md, so that no shape regresses. Ends with a summary: the
   verdict against 70 %, failures, the shapes where a finalist loses to the default, and the
   PrefillConfig that makes the best the default. Time boxes: PHASES (the job must end in 6 min).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]

from benchmarks.sweeps import prefill_cases as cases  # noqa: E402

PROBE_TIMEOUT_S = 90.0  # one variant's compile and first launch in a child (cold: ~10-30 s)
PARALLEL = max(1, min(8, (os.cpu_count() or 2) // 2))  # children at once
# seconds from the start: probes of phase 1 are killed by the first; phase 3 starts only before
# the second and its probes are killed by the third (a probe gets >= 20 s). Phase 2 (~30 s on an
# H200) always runs, so a hanging variant costs its probe, never the report.
PHASES = (150.0, 200.0, 230.0)


def log(msg: str) -> None:
    print(f"[prefill_sweep {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def checkpoint(rows: dict, shapes: dict, running: str | None = None) -> None:
    """Every row so far, and what runs now, to $PREFILL_SWEEP_PARTIAL if set: a run cut short
    (a variant hanging after its probe passed) keeps its numbers and names the culprit."""
    path = os.environ.get("PREFILL_SWEEP_PARTIAL")
    if path:
        partial = {"running": running, "rows": list(rows.values()),
                   "other_shapes": {k: list(v.values()) for k, v in shapes.items()}}  # fmt: skip
        Path(path).write_text(json.dumps(partial, indent=1, default=str))


def probe_main(spec: dict[str, Any]) -> int:
    """Child: launch one variant once on each shape; a JSON line per shape on stdout."""
    smoke, label = spec["smoke"], spec["variant"]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = cases.variants(smoke)[label]
    dims = cases.SMOKE_DIMS if smoke else cases.DIMS
    for shape in spec["shapes"]:
        t0 = time.perf_counter()
        try:
            cases.runner(label, cfg, cases.make_inputs(tuple(shape), dims, device))()
            if device.type == "cuda":
                torch.cuda.synchronize()
            res: dict[str, Any] = {"ok": True}
        except Exception as e:  # compile or launch error: the parent reports it
            res = {"ok": False, "error": f"{type(e).__name__}: {str(e).strip()[:400]}"}
        res.update(variant=label, shape=shape, seconds=time.perf_counter() - t0)
        print(json.dumps(res), flush=True)
    return 0


def probe(labels: list[str], shapes: list, smoke: bool, deadline: float) -> dict[str, dict]:
    """label -> {"error": None or why the variant cannot run, "seconds": the child's time}."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }

    def one(label: str) -> dict[str, Any]:
        spec = json.dumps({"variant": label, "shapes": shapes, "smoke": smoke})
        timeout = max(20.0, min(PROBE_TIMEOUT_S, deadline - time.monotonic()))
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "benchmarks.sweeps.prefill_sweep", "--probe", spec],
                cwd=ROOT, env=env,
                capture_output=True, text=True, timeout=timeout,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return {"error": f"probe killed after {timeout:.0f} s (compile or kernel hang)",
                    "seconds": time.monotonic() - t0}  # fmt: skip
        lines = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
        bad = [ln for ln in lines if not ln["ok"]]
        error = f"{cases.shape_label(bad[0]['shape'])}: {bad[0]['error']}" if bad else None
        if error is None and (proc.returncode or len(lines) < len(shapes)):
            tail = " | ".join((proc.stderr or "").strip().splitlines()[-4:])
            error = f"probe died (rc {proc.returncode}): {tail[-400:]}"
        return {"error": error, "seconds": time.monotonic() - t0}

    with ThreadPoolExecutor(PARALLEL) as pool:
        return dict(zip(labels, pool.map(one, labels)))


def measure(label, cfg, inp, refs, peak, probed: dict | None = None) -> dict[str, Any]:
    """Check (dense and paged variants) then time one variant on one shape."""
    row: dict[str, Any] = {
        "variant": label, "shape": cases.shape_label(inp["shape"]),
        "config": cfg._asdict() if cfg else None, "ms": None, "tflops": None,
        "pct_of_matmul": None, "check": None, "error": (probed or {}).get("error"),
        "probe_s": (probed or {}).get("seconds"),
    }  # fmt: skip
    if row["error"]:
        return row
    try:
        fn = cases.runner(label, cfg, inp)
        if label != "sdpa":
            inp["out"].fill_(float("nan"))  # a row the kernel skips fails the check
            fn()
            row["check"] = cases.check(inp["out"], refs)
        row["ms"] = cases.time_ms(fn)
        row["tflops"] = cases.flops(inp["shape"], inp["dims"]) / (row["ms"] * 1e-3) / 1e12
        row["pct_of_matmul"] = 100 * row["tflops"] / peak if peak else None
    except Exception as e:  # keep measuring the others
        row["error"] = f"{type(e).__name__}: {str(e).strip()[:400]}"
    return row


def print_row(row: dict[str, Any]) -> None:
    ms = f"{row['ms']:9.4f}" if row["ms"] else f"{'-':>9}"
    rate = f"{row['tflops']:8.1f}" if row["tflops"] else f"{'-':>8}"
    pct = f"{row['pct_of_matmul']:6.1f}%" if row["pct_of_matmul"] else f"{'-':>7}"
    if row["error"]:
        status = "FAILED " + row["error"][:150]
    elif row["check"]:
        c = row["check"]
        status = (
            "ok" if c["ok"] else "WRONG"
        ) + f" max_abs={c['max_abs']:.1e} rel_l2={c['rel_l2']:.1e}"
    else:
        status = "(not checked)"
    print(f"  {row['shape']:<22} {row['variant']:<22} {ms} {rate} {pct}  {status}", flush=True)


def fastest(rows: dict[str, dict], exclude=("paged", "sdpa")) -> list[str]:
    good = [k for k, r in rows.items() if k not in exclude and r["ms"] and r["check"]["ok"]]
    return sorted(good, key=lambda k: rows[k]["ms"])


def run_sweep(matmul_tflops: float | None, smoke: bool, phases=PHASES) -> dict:
    t_start = time.monotonic()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dims = cases.SMOKE_DIMS if smoke else cases.DIMS
    shape_8k = cases.SMOKE_8K if smoke else cases.SHAPE_8K
    others = cases.SMOKE_OTHER if smoke else cases.OTHER_SHAPES
    table = cases.variants(smoke)
    labels = list(table)
    log(f"probing {len(labels)} variants on {cases.shape_label(shape_8k)}, {PARALLEL} at a time")
    probed = probe(labels, [list(shape_8k)], smoke, t_start + phases[0])
    for label, p in probed.items():
        log(
            f"probe {label}: {p['seconds']:.1f} s"
            + (f", FAILED {p['error']}" if p["error"] else "")
        )

    inp = cases.make_inputs(shape_8k, dims, device) | {"dims": dims}
    refs = cases.reference(inp, None)
    log(f"{cases.shape_label(shape_8k)} causal, matmul ceiling {matmul_tflops or 0:.1f} TFLOP/s:")
    rows: dict[str, dict] = {}
    shapes: dict[str, dict] = {}
    for label in ["paged", "sdpa", *labels]:  # the references first, the riskiest variants last
        if label == "sdpa" and device.type != "cuda":
            continue
        checkpoint(rows, shapes, f"{cases.shape_label(shape_8k)} {label}")
        rows[label] = measure(label, table.get(label), inp, refs, matmul_tflops, probed.get(label))
        print_row(rows[label])
        checkpoint(rows, shapes)
    del inp, refs
    ranked = fastest(rows)
    best = ranked[0] if ranked else None
    # the default, the fastest few, and the fastest of each family (warp-specialized or not)
    ws = [k for k in ranked if table[k] and table[k].warp_spec]
    plain = [k for k in ranked if k not in ws]
    finalists = list(dict.fromkeys(["default", *ranked[: cases.FINALISTS], *ws[:1], *plain[:1]]))

    if time.monotonic() > t_start + phases[1]:
        log("out of time: the other shapes are skipped")
    else:
        log(f"probing {finalists} on {len(others)} more shapes")
        probed = probe(finalists, [list(s) for s in others], smoke, t_start + phases[2])
        for shape in others:
            inp = cases.make_inputs(shape, dims, device) | {"dims": dims}
            refs = cases.reference(inp, 128 if not smoke else 8)
            by_label = shapes.setdefault(cases.shape_label(shape), {})
            extra = ["sdpa"] if shape[1] == 0 and device.type == "cuda" else []
            for label in extra + finalists:
                checkpoint(rows, shapes, f"{cases.shape_label(shape)} {label}")
                by_label[label] = measure(label, table.get(label), inp, refs, matmul_tflops,
                                          probed.get(label))  # fmt: skip
                print_row(by_label[label])
                checkpoint(rows, shapes)
            del inp, refs
    return summarize(rows, shapes, best, finalists, table, matmul_tflops, t_start)


def summarize(rows, shapes, best, finalists, table, peak, t_start) -> dict[str, Any]:
    """The JSON report; prints the verdict, the other shapes and how to adopt the best."""
    pct = {k: r["pct_of_matmul"] for k, r in rows.items()}
    regressions = {}
    for shape, by_label in shapes.items():
        ref_ms = by_label.get("default", {}).get("ms")
        for label, r in by_label.items():
            broken = r["error"] or (r["check"] and not r["check"]["ok"])
            if label not in ("default", "sdpa") and (
                broken or (ref_ms and r["ms"] > 1.03 * ref_ms)
            ):
                regressions.setdefault(label, []).append(shape)
    report = {
        "matmul_bf16_TFLOPs": peak,
        "target_pct_of_matmul": cases.TARGET_PCT,
        "best": best,
        "best_config": table[best]._asdict() if best and table.get(best) else None,
        "best_pct_of_matmul": pct.get(best),
        "best_meets_target": bool(best and (pct.get(best) or 0) >= cases.TARGET_PCT),
        "default_pct_of_matmul": pct.get("default"),
        "sdpa_pct_of_matmul": pct.get("sdpa"),
        "failed": {k: r["error"] for k, r in rows.items() if r["error"]},
        "wrong": [k for k, r in rows.items() if r["check"] and not r["check"]["ok"]],
        "finalists": finalists,
        "regressions": regressions,  # finalist -> shapes where it is > 3 % slower than default
        "rows": list(rows.values()),
        "other_shapes": {shape: list(by.values()) for shape, by in shapes.items()},
        "elapsed_s": time.monotonic() - t_start,
    }
    print("\n==== prefill sweep summary", flush=True)
    for label in dict.fromkeys([best, "default", "sdpa"]):
        if label and rows.get(label, {}).get("ms"):
            r = rows[label]
            print(f"  {label:<22} {r['ms']:.4f} ms {r['tflops']:7.1f} TFLOP/s "
                  f"{r['pct_of_matmul'] or 0:5.1f} % of matmul")  # fmt: skip
    verdict = "MET" if report["best_meets_target"] else "NOT MET"
    print(f"  target {cases.TARGET_PCT:.0f} % of the matmul ceiling: {verdict} (best: {best})")
    for label, error in report["failed"].items():
        print(f"  failed: {label}: {error[:200]}")
    for label in report["wrong"]:
        print(f"  wrong results: {label}")
    if shapes:
        columns = [*finalists, "sdpa"]
        print("  other shapes, ms: " + " | ".join(columns))
        for shape, by_label in shapes.items():
            cells = [f"{by_label[k]['ms']:.4f}" if by_label.get(k, {}).get("ms") else "-"
                     for k in columns]  # fmt: skip
            print(f"    {shape:<22} " + " | ".join(cells))
    for label, bad in regressions.items():
        print(f"  {label} is slower than the default (or fails) on: {', '.join(bad)}")
    if best and best != "default":
        print(f"  to make {best} the default: kernels/dense_prefill_attention.py, "
              f"CONFIG_16BIT = {table[best]!r}")  # fmt: skip
    print(f"  sweep took {report['elapsed_s']:.0f} s", flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not torch.cuda.is_available():  # before kernels.* is imported (decided at @triton.jit)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if argv[:1] == ["--probe"]:
        return probe_main(json.loads(argv[1]))
    from benchmarks.kernel_bench.driver import main as kernel_bench_main

    return kernel_bench_main(["--only", "prefill_sweep", *argv])


if __name__ == "__main__":
    sys.exit(main())
