# `fleetlm bench engine`: run the engine on a benchmark workload and print / write the figures
# (output and total tok/s, TTFT and TPOT percentiles, step breakdown, GPU idle, roofline).
# --overlap both runs each workload with overlapped scheduling off, then on, on one engine.
from __future__ import annotations

import argparse
import json
import sys

# --overlap: the engine's overlap_scheduling for each run of a workload (None: the engine's own
# default, as served).
OVERLAP_MODES: dict[str, list[bool | None]] = {
    "auto": [None], "off": [False], "on": [True], "both": [False, True],
}  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:
    from fleetlm import bench_serve_cmd

    p = sub.add_parser("bench", help="benchmarks (engine, serve)")
    kinds = p.add_subparsers(dest="bench_kind", required=True, metavar="KIND")
    bench_serve_cmd.register(kinds)
    e = kinds.add_parser("engine", help="the engine on the nano or seed workload")
    e.add_argument("--model", default="llama-3.1-8b", help="preset or HF checkpoint directory")
    e.add_argument("--workload", choices=("nano", "seed"), default="nano")
    e.add_argument("--num-requests", type=int, default=None)
    e.add_argument("--rates", default="", help="seed: comma-separated Poisson rates (req/s)")
    e.add_argument("--detokenize", action="store_true", help="produce text, as serving does")
    e.add_argument("--device", default="auto")
    e.add_argument("--dtype", default="auto")
    e.add_argument("--max-num-seqs", type=int, default=256)
    e.add_argument(
        "--max-num-batched-tokens", type=int, default=_engine_default("max_num_batched_tokens")
    )
    e.add_argument("--num-kv-blocks", type=int, default=None)
    e.add_argument("--quantization", choices=("fp8",), default=None, help="FP8 weights")
    e.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto")
    e.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs (one process each)")
    e.add_argument(
        "--overlap", choices=("auto", "off", "on", "both"), default="auto",
        help="overlapped scheduling (docs/serving.md); auto: the engine's default, as served "
        "(on for one GPU without speculation); both: off then on, compared",
    )  # fmt: skip
    e.add_argument(
        "--repeats", type=int, default=1,
        help="nano: timed runs on the one engine (run-to-run spread; the median is reported)",
    )  # fmt: skip
    e.add_argument("--json", default=None, help="write the results here")
    e.set_defaults(func=run)


def _engine_default(name: str):
    from dataclasses import fields

    from engine.config import EngineConfig  # torch-free

    return next(f.default for f in fields(EngineConfig) if f.name == name)


def run(args: argparse.Namespace) -> int:
    from engine import EngineConfig, LLMEngine

    engine = LLMEngine(
        EngineConfig(
            model=args.model, device=args.device, dtype=args.dtype, max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens, num_kv_blocks=args.num_kv_blocks,
            quantization=args.quantization, kv_cache_dtype=args.kv_cache_dtype,
            tensor_parallel_size=args.tensor_parallel_size,
            overlap_scheduling=OVERLAP_MODES[args.overlap][0],
        )
    )  # fmt: skip
    try:
        return _bench(args, engine)
    finally:
        engine.shutdown()  # a tensor-parallel engine's other ranks


def _bench(args: argparse.Namespace, engine) -> int:
    from fleetlm.bench.engine_bench import run_workload
    from fleetlm.bench.workloads import SEED_TRAFFIC, describe, generate, nano

    vocab = engine.model_config.vocab_size
    room = engine.max_model_len
    runs: dict[str, dict] = {}
    modes = OVERLAP_MODES[args.overlap]
    if args.workload == "nano":
        reqs = nano(args.num_requests or 256, vocab=vocab)
        _fit(reqs, room)
        run_workload(engine, reqs, detokenize=args.detokenize)  # untimed: compiles kernels
        for overlap in modes:
            if overlap is not None:
                engine.set_overlap_scheduling(overlap)
            for i in range(max(1, args.repeats)):
                engine.block_manager.reset_prefix_cache()
                name = "all_at_once" + ("+overlap" if overlap and len(modes) > 1 else "")
                name += f"#{i + 1}" if i else ""
                runs[name] = run_workload(engine, reqs, detokenize=args.detokenize)
                runs[name]["workload"] = describe(reqs)
    else:
        n = args.num_requests or 160
        rates = [float(r) for r in args.rates.split(",") if r] or [None]
        fit = {"max_prompt_tokens": room - 2048, "max_total_tokens": room}
        warm = generate(SEED_TRAFFIC, vocab=vocab, seed=9, num_requests=16, **fit)
        _fit(warm, room)
        run_workload(engine, warm, detokenize=args.detokenize)
        for rate in rates:
            reqs = generate(SEED_TRAFFIC, vocab=vocab, seed=2, rate=rate, num_requests=n, **fit)
            _fit(reqs, room)
            for overlap in modes:
                if overlap is not None:
                    engine.set_overlap_scheduling(overlap)
                engine.block_manager.reset_prefix_cache()
                result = run_workload(engine, reqs, detokenize=args.detokenize)
                result["rate_req_s"] = rate
                result["workload"] = describe(reqs)
                name = "all_at_once" if rate is None else f"rate_{rate}"
                runs[name + ("+overlap" if overlap and len(modes) > 1 else "")] = result
    for name, r in runs.items():
        print(
            f"{name}: {r['output_tok_s']:.0f} out tok/s, {r['total_tok_s']:.0f} total tok/s, "
            f"TTFT p50/p95 {r['ttft_s']['p50']:.3f}/{r['ttft_s']['p95']:.3f} s, "
            f"TPOT p50/p95 {1e3 * r['tpot_s']['p50']:.1f}/{1e3 * r['tpot_s']['p95']:.1f} ms, "
            f"GPU idle {100 * r['gpu_idle_fraction']:.1f}% "
            f"({100 * r['gpu_idle_between_steps']:.1f}% between steps), "
            f"overlapped steps {100 * r['overlapped_steps']:.0f}%, "
            f"longest step {r['step_ms']['max']:.0f} ms, "
            f"prefix hits {r['prefix_hit_rate']:.2f}, preemptions {r['preemptions']}"
        )
    roofline = _nano_roofline(args, engine, reqs, runs) if args.workload == "nano" else None
    forecast = _seed_forecast(args, engine, runs) if args.workload == "seed" else None
    for name, r in runs.items():
        plain = runs.get(name.removesuffix("+overlap"))
        if name.endswith("+overlap") and plain is not None:
            speedup = r["output_tok_s"] / plain["output_tok_s"]
            print(
                f"{name}: overlap on/off: output tok/s x{speedup:.3f}, "
                f"GPU idle between steps {100 * plain['gpu_idle_between_steps']:.2f}% -> "
                f"{100 * r['gpu_idle_between_steps']:.2f}% (at {r['max_running']} running: "
                f"{100 * plain['gpu_idle_at_max_running']:.2f}% -> "
                f"{100 * r['gpu_idle_at_max_running']:.2f}%)"
            )
    if args.json:
        with open(args.json, "w") as f:
            config = {k: getattr(args, k) for k in ("dtype", "quantization", "kv_cache_dtype",
                                                     "tensor_parallel_size", "overlap",
                                                     "detokenize")}  # fmt: skip
            json.dump({"model": args.model, "workload": args.workload, "engine": config,
                       "runs": runs, "roofline": roofline, "forecast": forecast},
                      f, indent=2)  # fmt: skip
    bad = [n for r in runs.values() for n in r["unexpected_finishes"]]
    if bad:
        print(f"fleetlm bench: {len(bad)} requests ended unexpectedly: {bad[:5]}", file=sys.stderr)
        return 1
    return 0


def _nano_roofline(args: argparse.Namespace, engine, reqs, runs: dict) -> dict | None:
    """On one GPU: the workload's roofline (engine_bench.workload_floor_s) with the copy and
    matmul ceilings measured now, on this GPU, and each run's output tok/s as a fraction."""
    import statistics

    import torch

    from fleetlm.bench.engine_bench import workload_floor_s
    from fleetlm.bench.roofline_check import measure_ceilings, measured_deployment
    from fleetlm.capacity.gpus import gpu_for_device

    # One GPU; FP8 weights are held to the measured e4m3 matmul rate, an e4m3 cache to its bytes.
    if engine.device.type != "cuda" or args.tensor_parallel_size != 1:
        return None
    fp8 = args.quantization == "fp8"
    ceilings = measure_ceilings(engine.device)
    gpu = gpu_for_device(torch.cuda.get_device_name(engine.device)) or "H100"  # ceilings: ours
    dtypes = {
        "weights_dtype": "fp8" if fp8 else "bf16",
        "kv_dtype": "fp8" if args.kv_cache_dtype == "fp8" else "bf16",
    }
    dep = measured_deployment(args.model, gpu, ceilings, **dtypes)
    floor = workload_floor_s(dep, reqs, max_batch=args.max_num_seqs)
    bound = floor["roofline_output_tok_s"]
    fractions = {name: r["output_tok_s"] / bound for name, r in runs.items()}
    median = statistics.median(fractions.values())
    print(
        f"roofline {bound:.0f} output tok/s (copy {ceilings['copy_bytes_s'] / 1e12:.2f} TB/s, "
        f"matmul {dep.peak_flops / 1e12:.0f} TFLOP/s {dep.compute_dtype}, measured now): "
        + ", ".join(f"{name} {100 * x:.1f} %" for name, x in fractions.items())
        + (f"; median {100 * median:.1f} %" if len(fractions) > 1 else "")
    )
    return {"ceilings": ceilings, **floor, "fraction": fractions, "median_fraction": median}


def _seed_forecast(args: argparse.Namespace, engine, runs: dict) -> dict | None:
    """On one GPU: `fleetlm plan`'s forecast for seed with the ceilings measured now, and each
    Poisson run's TPOT and TTFT p95 over the forecast's at its rate (measured ÷ plan)."""
    import torch

    from fleetlm.bench.roofline_check import forecast_at_rates, measure_ceilings
    from fleetlm.capacity.gpus import gpu_for_device

    timed = {name: r for name, r in runs.items() if r.get("rate_req_s")}
    if engine.device.type != "cuda" or args.tensor_parallel_size != 1 or not timed:
        return None
    gpu = gpu_for_device(torch.cuda.get_device_name(engine.device)) or "H100"
    report = forecast_at_rates(
        args.model, gpu, measure_ceilings(engine.device),
        sorted({r["rate_req_s"] for r in timed.values()}),
        weights_dtype="fp8" if args.quantization == "fp8" else "bf16",
        kv_dtype="fp8" if args.kv_cache_dtype == "fp8" else "bf16",
    )  # fmt: skip
    f = report["forecast"]
    print(
        f"forecast (1x{gpu}, ceilings measured now): {f['rate_req_s']:.2f} req/s at the "
        f"targets, limited by {f['limited_by']}"
    )
    report["measured_over_forecast"] = {}
    for name, r in timed.items():
        at = report["at_rate"][str(r["rate_req_s"])]
        tpot, ttft = r["tpot_s"]["p95"], r["ttft_s"]["p95"]
        if at["violated"] == "throughput":  # past the forecast's saturation: no latency
            report["measured_over_forecast"][name] = None
            print(f"  {name}: past the forecast's saturation")
            continue
        ratios = {"tpot_p95": tpot / at["tpot_p95_s"], "ttft_p95": ttft / at["ttft_p95_s"]}
        report["measured_over_forecast"][name] = ratios
        print(
            f"  {name}: TPOT p95 {1e3 * tpot:.1f} ms, forecast {1e3 * at['tpot_p95_s']:.1f} "
            f"(x{ratios['tpot_p95']:.2f}); TTFT p95 {ttft:.3f} s, forecast "
            f"{at['ttft_p95_s']:.3f} (x{ratios['ttft_p95']:.2f})"
        )
    return report


def _fit(reqs, max_model_len: int) -> None:
    # Small models (the CPU `tiny` preset) have short contexts: clip so every request fits.
    for r in reqs:
        r.prompt_ids = r.prompt_ids[: max(1, max_model_len // 2)]
        r.max_tokens = max(1, min(r.max_tokens, max_model_len - len(r.prompt_ids)))
