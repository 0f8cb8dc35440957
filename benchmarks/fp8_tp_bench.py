# FP8 and tensor parallelism on GPUs (issue 19), one part per device call, everything under --out:
#   plan       fleetlm plan's roofline for every configuration below (CPU arithmetic, seconds)
#   tests      the GPU tests of FP8 and TP (pytest; needs 2 GPUs for the TP ones)
#   kernels    kernel_bench: the fp8 section and the bf16 decode rows to set beside it
#   stream     `fleetlm serve --model llama-3.1-70b --quantization fp8 --tensor-parallel-size 2`
#              started, one streamed completion logged chunk by chunk, stopped
#   serve70b   `fleetlm bench serve --launch --compare-engine` of that server on `seed` traffic:
#              goodput at TTFT p95 < 0.8 s and TPOT p95 < 40 ms, served and bare engine
#   engine70b  the bare engine alone (no serving stack needed), 70B FP8 TP=2 on `seed`
#   engine8b   llama-3.1-8b on one GPU, `seed` at fixed rates: bf16, FP8 weights, FP8 weights +
#              FP8 KV, bf16 + FP8 KV (each in its own process)
# then a summary of every JSON found in --out beside the plan's predictions.
#   python -m benchmarks.fp8_tp_bench --out $OUT --parts plan,tests,kernels
#   python -m benchmarks.fp8_tp_bench --out $OUT --parts stream,serve70b    # serving wheels needed
#   python -m benchmarks.fp8_tp_bench --out $OUT --parts engine8b --configs-8b bf16,fp8
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MODEL_70B, MODEL_8B = "llama-3.1-70b", "llama-3.1-8b"  # --big-model / --small-model
FP8_TP2 = {"FLEETLM_QUANTIZATION": "fp8", "FLEETLM_TENSOR_PARALLEL_SIZE": "2"}
# (name, bench engine flags) on one GPU
CONFIGS_8B = [
    ("bf16", []),
    ("fp8", ["--quantization", "fp8"]),
    ("fp8+fp8kv", ["--quantization", "fp8", "--kv-cache-dtype", "fp8"]),
    ("bf16+fp8kv", ["--kv-cache-dtype", "fp8"]),
]
PLANS = {
    "70b_fp8_tp2": [MODEL_70B, "fp8", "bf16", "2xH200"],
    "70b_fp8_tp2_fp8kv": [MODEL_70B, "fp8", "fp8", "2xH200"],
    "8b_bf16": [MODEL_8B, "bf16", "bf16", "1xH200"],
    "8b_fp8": [MODEL_8B, "fp8", "bf16", "1xH200"],
    "8b_fp8_fp8kv": [MODEL_8B, "fp8", "fp8", "1xH200"],
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def fleetlm(*argv: str, out: Path | None = None) -> int:
    """`fleetlm ...` in a child process (its GPUs are free again when it returns)."""
    cmd = [sys.executable, "-m", "fleetlm.cli", *argv]
    log("$ fleetlm " + " ".join(argv))
    with open(out, "w") if out else open("/dev/null", "w") as sink:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=sink if out else None, text=True)
    if out and out.suffix == ".log":
        print(out.read_text()[-3000:], flush=True)
    return proc.returncode


def part_plan(out: Path, args) -> None:
    for name, (model, weights, kv, gpus) in PLANS.items():
        fleetlm("plan", "--model", model, "--weights-dtype", weights, "--kv-dtype", kv,
                "--gpus", gpus, "--workload", "seed", "--json",
                out=out / f"plan_{name}.json")  # fmt: skip


def part_tests(out: Path, args) -> None:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "tests/engine/test_fp8_tp_gpu.py", "tests/kernels/test_fp8_quant.py",
           "tests/kernels/test_fp8_kv_cache.py", "tests/engine/test_gpu_paths.py"]  # fmt: skip
    with open(out / "gpu_tests.log", "w") as f:
        subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    print((out / "gpu_tests.log").read_text()[-3000:], flush=True)


def part_kernels(out: Path, args) -> None:
    subprocess.run([sys.executable, "-m", "benchmarks.kernel_bench", "--only", "fp8,decode",
                    "--json", str(out / "kernels_fp8.json")], cwd=ROOT)  # fmt: skip


def part_stream(out: Path, args) -> None:
    """One streamed request through the API of the 70B FP8 TP=2 server, chunk by chunk."""
    import urllib.request

    from fleetlm.bench.launcher import LaunchedServer

    log(f"starting fleetlm serve --model {args.big_model} (FP8, tensor parallel 2)")
    started = time.monotonic()
    server = LaunchedServer(args.big_model, env=FP8_TP2, keep_logs=out / "stream-server").start()
    lines = [f"server ready in {time.monotonic() - started:.0f} s at {server.base_url}"]
    try:
        with urllib.request.urlopen(server.base_url.removesuffix("/v1") + "/ready") as r:
            lines.append(f"/ready: {r.read().decode()}")
        body = {"model": args.big_model, "prompt": list(range(1000, 1400)), "max_tokens": 32,
                "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        req = urllib.request.Request(
            server.base_url + "/completions", data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {server.api_key}",
                     "Content-Type": "application/json"},
        )  # fmt: skip
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=300) as r:
            for raw in r:
                line = raw.decode().strip()
                if line:
                    lines.append(f"+{1e3 * (time.perf_counter() - t0):8.1f} ms  {line[:160]}")
    finally:
        server.cleanup()
    (out / "stream.log").write_text("\n".join(lines) + "\n")
    print("\n".join([*lines[:6], "...", *lines[-3:]]), flush=True)


def part_serve70b(out: Path, args) -> None:
    env = [f"--server-env={k}={v}" for k, v in FP8_TP2.items()]
    fleetlm("bench", "serve", "--launch", "--model", args.big_model, *env,
            "--rates", args.rates_70b, "--bisect", str(args.bisect),
            "--duration", str(args.duration), "--compare-engine",
            "--json", str(out / "serve_70b_fp8_tp2.json"), "--plot",
            str(out / "serve_70b_fp8_tp2.png"), "--server-logs", str(out / "serve70b-logs"),
            out=out / "serve_70b_fp8_tp2.log")  # fmt: skip


def part_engine70b(out: Path, args) -> None:
    fleetlm("bench", "engine", "--model", args.big_model, "--workload", "seed", "--rates",
            args.rates_70b, "--quantization", "fp8", "--tensor-parallel-size", "2", "--json",
            str(out / "engine_70b_fp8_tp2.json"), out=out / "engine_70b_fp8_tp2.log")  # fmt: skip


def part_engine8b(out: Path, args) -> None:
    wanted = set(args.configs_8b.split(","))
    for name, flags in [c for c in CONFIGS_8B if c[0] in wanted]:
        fleetlm("bench", "engine", "--model", args.small_model, "--workload", "seed", "--dtype",
                "bfloat16", "--rates", args.rates_8b, *flags, "--json",
                str(out / f"engine_8b_{name}.json"), out=out / f"engine_8b_{name}.log")  # fmt: skip


def summary(out: Path) -> None:
    plans = {}
    for name in PLANS:
        path = out / f"plan_{name}.json"
        if path.exists():
            plans[name] = json.loads(path.read_text()).get("serving", {})
    for name, serving in plans.items():
        tok = serving.get("output_tok_s")
        print(f"plan {name}: {tok and f'{tok:,.0f}'} out tok/s at the targets (roofline)")
    for path in sorted(out.glob("engine_*.json")):
        for run_name, r in json.loads(path.read_text())["runs"].items():
            print(f"{path.stem} {run_name}: {r['output_tok_s']:,.0f} out tok/s, "
                  f"TTFT p95 {r['ttft_s']['p95']:.3f} s, TPOT p95 "
                  f"{1e3 * r['tpot_s']['p95']:.1f} ms")  # fmt: skip
    serve = out / "serve_70b_fp8_tp2.json"
    if serve.exists():
        data = json.loads(serve.read_text())
        for backend in ("served", "engine"):
            sw = data.get(backend)
            if sw:
                print(f"70B FP8 TP=2 {backend}: goodput {sw['goodput_rate']} req/s, "
                      f"{sw['goodput_output_tok_s']:,.0f} out tok/s")  # fmt: skip


PARTS = {
    "plan": part_plan, "tests": part_tests, "kernels": part_kernels, "stream": part_stream,
    "serve70b": part_serve70b, "engine70b": part_engine70b, "engine8b": part_engine8b,
}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="FP8 and tensor parallelism on GPUs (issue 19)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--parts", default="plan,tests,kernels", help=",".join(PARTS))
    p.add_argument("--big-model", default=MODEL_70B, help="stream / serve70b / engine70b")
    p.add_argument("--small-model", default=MODEL_8B, help="engine8b")
    p.add_argument("--rates-70b", default="8,12", help="req/s for serve70b / engine70b")
    p.add_argument("--rates-8b", default="6,9", help="req/s for engine8b")
    p.add_argument("--configs-8b", default=",".join(c[0] for c in CONFIGS_8B),
                   help="engine8b: which of " + ", ".join(c[0] for c in CONFIGS_8B))  # fmt: skip
    p.add_argument("--duration", type=float, default=45.0, help="serve70b: seconds per rate")
    p.add_argument("--bisect", type=int, default=1, help="serve70b: goodput bisection rounds")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in [s.strip() for s in args.parts.split(",") if s.strip()]:
        log(f"== {name}")
        try:
            PARTS[name](args.out, args)
        except Exception as exc:  # one broken part must not lose the others' figures
            log(f"{name} failed: {type(exc).__name__}: {exc}")
    summary(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
