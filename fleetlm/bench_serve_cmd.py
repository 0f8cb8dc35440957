# `fleetlm bench serve`: open-loop load at a list of rates against an OpenAI-compatible server
# (--base-url, or --launch to start `fleetlm serve` here), steady-state percentiles per rate and
# class, goodput by sweep + bisection, JSON and a PNG; --compare-engine then replays the identical
# requests through the bare engine in this process (--backend engine runs only that).
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path


def register(kinds: argparse._SubParsersAction) -> None:
    s = kinds.add_parser("serve", help="sustained open-loop load, served vs bare engine")
    s.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    s.add_argument("--api-key", default=None, help="default: $OPENAI_API_KEY")
    s.add_argument("--admin-key", default=None,
                   help="a fleetlm admin key, for per-worker prefix hit rate and routed/stolen "
                   "counts (default: $FLEETLM_ADMIN_KEY; --launch: the server's own)")  # fmt: skip
    s.add_argument("--model", default=None, help="served model id / the model to launch")
    s.add_argument("--launch", action="store_true", help="start `fleetlm serve` for the run")
    s.add_argument("--workers", type=int, default=None,
                   help="--launch: `fleetlm serve --workers N` (default: one per GPU)")  # fmt: skip
    s.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                   help="FLEETLM_* settings for the served and the bare engine")  # fmt: skip
    s.add_argument("--backend", choices=("http", "engine"), default="http")
    s.add_argument("--compare-engine", action="store_true",
                   help="afterwards, the same requests through the bare engine")  # fmt: skip
    s.add_argument("--traffic", default="seed")
    s.add_argument("--system-prompts", type=int, default=None,
                   help="distinct shared system prompts (default: the traffic's; more than one "
                   "GPU's prefix cache holds is where routing matters)")  # fmt: skip
    s.add_argument("--rates", default="3,5,7", help="comma-separated Poisson rates (req/s)")
    s.add_argument("--bisect", type=int, default=0, help="bisection rounds for goodput")
    s.add_argument("--no-stop-on-miss", action="store_true",
                   help="run every listed rate even after one misses the targets")  # fmt: skip
    s.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals per rate")
    s.add_argument("--warmup-fraction", type=float, default=0.3,
                   help="leading share of each rate's arrivals not measured")  # fmt: skip
    s.add_argument("--warmup-s", type=float, default=10.0, help="untimed traffic before a sweep")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    s.add_argument("--clients", type=int, default=None, help="client processes")
    s.add_argument("--drain-timeout", type=float, default=180.0,
                   help="after the last arrival, how long running requests may take")  # fmt: skip
    s.add_argument("--ttft-target", type=float, default=None)
    s.add_argument("--tpot-target", type=float, default=None)
    s.add_argument("--vocab-size", type=int, default=None, help="token ids drawn below this")
    s.add_argument("--max-prompt", type=int, default=None, help="clip prompts to this many tokens")
    s.add_argument("--server-logs", type=Path, default=None,
                   help="--launch: keep serve.log and the worker step traces here")  # fmt: skip
    s.add_argument("--json", type=Path, default=None)
    s.add_argument("--plot", type=Path, default=None, help="PNG of TTFT/TPOT p95 vs rate")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fleetlm.bench.latency import Targets
    from fleetlm.bench.serve_bench import compare
    from fleetlm.bench.workloads import TRAFFIC

    if args.traffic not in TRAFFIC:
        raise SystemExit(f"unknown traffic {args.traffic!r}; known: {', '.join(TRAFFIC)}")
    spec = TRAFFIC[args.traffic]
    if args.system_prompts:
        spec = dataclasses.replace(spec, num_system_prompts=args.system_prompts)
    base = Targets.for_workload(args.traffic)
    targets = Targets(
        args.ttft_target or base.ttft_s, base.ttft_max_prompt_tokens,
        args.tpot_target or base.tpot_s, base.max_error_fraction,
    )  # fmt: skip
    for item in args.server_env:
        name, _, value = item.partition("=")
        os.environ[name] = value  # the launched server inherits it; Settings() reads it
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    result: dict = {
        "command": "fleetlm " + " ".join(sys.argv[1:]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": _machine(),
        "traffic": spec.to_dict(),
        "targets": {
            "ttft_s": targets.ttft_s,
            "tpot_s": targets.tpot_s,
            "ttft_max_prompt_tokens": targets.ttft_max_prompt_tokens,
        },
        "duration_s": args.duration,
        "warmup_fraction": args.warmup_fraction,
        "seed": args.seed,
        "server_env": dict(i.partition("=")[::2] for i in args.server_env),
        # Settings inherited from this environment (a launched server and the bare engine read
        # them too): which configuration made the figures.
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("FLEETLM_")},
    }
    sweeps: dict[str, dict] = {}
    partial: dict[str, list] = {}

    def checkpoint(backend: str):
        # Each finished rate is written at once, so a run cut short still leaves its figures.
        def save(run: dict) -> None:
            partial.setdefault(backend, []).append(run)
            if args.json:
                _write_json(args.json, result | {"partial": partial})

        return save

    plan = None
    if args.backend == "http":
        plan, sweeps["served"] = _served_sweep(
            args, spec, rates, targets, result, checkpoint("served")
        )
    if args.backend == "engine" or args.compare_engine:
        sweeps["engine"] = _engine_sweep(args, spec, rates, targets, plan, checkpoint("engine"))
    result.update(sweeps)
    if "served" in sweeps and "engine" in sweeps:
        result["comparison"] = compare(sweeps["served"], sweeps["engine"])
    _add_roofline(args, result, sweeps)
    _print_summary(sweeps, result.get("comparison"))
    if args.json:
        _write_json(args.json, result)
        print(f"wrote {args.json}")
    if args.plot:
        from fleetlm.bench.plot import plot_sweeps

        title = (
            f"{args.traffic} traffic, {result.get('model', args.model)}, {args.duration:g}s/rate"
        )
        if plot_sweeps(sweeps, targets, args.plot, title):
            print(f"wrote {args.plot}")
        else:
            print("no plot: matplotlib is not installed", file=sys.stderr)
    return 0


def _write_json(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_jsonable(result), indent=1, allow_nan=False))


def _served_sweep(args, spec, rates, targets, result, on_run):
    from fleetlm.bench.fleet_stats import FleetStats
    from fleetlm.bench.launcher import LaunchedServer
    from fleetlm.bench.loadgen import Target
    from fleetlm.bench.serve_bench import HttpBackend, run_rate, sweep

    server = None
    if args.launch:
        print(f"starting fleetlm serve ({args.model or 'the configured model'})...", flush=True)
        started = time.monotonic()
        server = LaunchedServer(
            args.model, keep_logs=args.server_logs, workers=args.workers
        ).start()
        result["server_start_s"] = time.monotonic() - started
    try:
        base_url = server.base_url if server else args.base_url.rstrip("/")
        api_key = server.api_key if server else (args.api_key or os.environ.get("OPENAI_API_KEY"))
        if not api_key:
            raise SystemExit("fleetlm bench serve: --api-key (or $OPENAI_API_KEY) is required")
        model, max_len, served_vocab = _served_model(base_url, api_key, args.model)
        result["model"] = model
        local = args.model
        if local is None and server is not None:
            from service.settings import Settings

            local = Settings().model  # what the launched server loads
        plan = _plan(args, spec, max_len, _vocab(args, local or model, served_vocab))
        target = Target(base_url, api_key, model, endpoint=args.endpoint)
        reader = None
        if server is not None:
            from workers.gpu.step_timing import read_step_trace

            def reader():
                return [read_step_trace(p) for p in server.trace_files()]

        clients = args.clients or max(1, min(8, (os.cpu_count() or 2) // 4))
        admin_key = args.admin_key or os.environ.get("FLEETLM_ADMIN_KEY")
        if server is not None:
            admin_key = admin_key or server.admin_key
        fleet = FleetStats(base_url, admin_key) if admin_key else None
        backend = HttpBackend(
            target, num_processes=clients, drain_timeout_s=args.drain_timeout,
            trace_reader=reader, fleet=fleet,
            usage_reader=server.request_timings if server is not None else None,
            admission_reader=server.admission_timings if server is not None else None,
            stall_reader=server.loop_stalls if server is not None else None,
        )  # fmt: skip
        print(f"served: {model} at {base_url}, {clients} client processes", flush=True)
        warm = _warm_up(backend, plan, rates[0], args.warmup_s)
        swept = sweep(
            lambda rate: run_rate(backend, plan, rate, targets), rates,
            bisect_rounds=args.bisect, stop_after_failure=not args.no_stop_on_miss,
            on_run=on_run,
        )  # fmt: skip
        if warm:
            swept["warmup"] = warm
        return plan, swept
    finally:
        if server is not None:
            server.cleanup()


def _engine_sweep(args, spec, rates, targets, plan, on_run):
    from fleetlm.bench.serve_bench import EngineBackend, run_rate, sweep
    from service.settings import Settings
    from workers.gpu.worker import build_engine

    settings = Settings(**({"model": args.model} if args.model else {}))
    print(f"engine: building {settings.model} in this process...", flush=True)
    engine = build_engine(settings)
    if plan is None:
        plan = _plan(args, spec, engine.max_model_len, _vocab(args, settings.model))
    backend = EngineBackend(engine)
    warm = _warm_up(backend, plan, rates[0], args.warmup_s)
    result = sweep(
        lambda rate: run_rate(backend, plan, rate, targets), rates,
        bisect_rounds=args.bisect, stop_after_failure=not args.no_stop_on_miss, on_run=on_run,
    )  # fmt: skip
    if warm:
        result["warmup"] = warm
    if engine.device.type == "cuda":  # the ceilings of this very GPU, for the roofline
        import torch

        from fleetlm.bench.roofline_check import measure_ceilings
        from fleetlm.capacity.gpus import gpu_for_device

        result["ceilings"] = measure_ceilings(engine.device)
        result["gpu"] = gpu_for_device(torch.cuda.get_device_name(engine.device))
        result["deployment"] = {
            "model": settings.model,
            "weights_dtype": "fp8" if settings.quantization == "fp8" else "bf16",
            "kv_dtype": "fp8" if settings.kv_cache_dtype == "fp8" else "bf16",
        }
    return result


def _warm_up(backend, plan, rate: float, seconds: float) -> dict | None:
    """Untimed traffic on a cold server; what failed in it is kept (by priority and status,
    e.g. http_503:overloaded for a request load shedding refused) though no figure uses it."""
    if seconds <= 0:
        return None
    requests = plan.requests(rate, seed=plan.seed + 10_000, duration_s=seconds)
    if not requests:
        return None
    records, _, _ = backend.run(requests, f"{backend.name} warm-up")
    errors: dict[str, dict[str, int]] = {}
    for r in records:
        if not r.ok:
            by_status = errors.setdefault(r.priority, {})
            by_status[r.status] = by_status.get(r.status, 0) + 1
    num_failed = sum(n for by_status in errors.values() for n in by_status.values())
    if num_failed:
        print(f"{backend.name} warm-up: {num_failed} of {len(records)} failed: {errors}")
    return {"rate": rate, "duration_s": seconds, "num_requests": len(records), "errors": errors}


def _plan(args, spec, max_model_len: int | None, vocab: tuple[int, frozenset[int]]):
    from fleetlm.bench.serve_bench import TrafficPlan

    max_prompt = args.max_prompt
    if max_model_len:
        room = max_model_len - spec.output_max if max_model_len > 2 * spec.output_max else None
        room = room or max(1, max_model_len // 2)
        max_prompt = min(max_prompt or room, room)
    size, excluded = vocab
    return TrafficPlan(
        spec, size, args.seed, args.duration, args.warmup_fraction,
        max_prompt_tokens=max_prompt, max_total_tokens=max_model_len, excluded_ids=excluded,
    )  # fmt: skip


def _vocab(args, model: str | None, served: int | None = None) -> tuple[int, frozenset[int]]:
    """Token ids to draw prompts from: --vocab-size if given; the model's vocabulary without
    its special tokens when the model is known here (a preset or a local checkpoint); the
    vocabulary the server's model card states (fleetlm's does); else below 32,000."""
    if args.vocab_size:
        return args.vocab_size, frozenset()
    if model:
        from engine.models.config import resolve_model_config
        from engine.tokenizer import Tokenizer

        try:
            size = resolve_model_config(model).vocab_size
            return size, frozenset(Tokenizer.for_model(model).all_special_ids)
        except (OSError, ValueError, KeyError):
            pass
    return (served or 32000), frozenset()


def _served_model(
    base_url: str, api_key: str, wanted: str | None
) -> tuple[str, int | None, int | None]:
    req = urllib.request.Request(
        base_url + "/models", headers={"Authorization": f"Bearer {api_key}"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        cards = json.load(r)["data"]
    if not cards:
        raise SystemExit("fleetlm bench serve: the server lists no model")
    card = next((c for c in cards if c["id"] == wanted), None) or cards[0]
    return card["id"], card.get("max_model_len"), card.get("vocab_size")


def _machine() -> dict:
    info = {"host": socket.gethostname(), "platform": platform.platform(),
            "cpus": os.cpu_count()}  # fmt: skip
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
        info["gpus"] = [line for line in out.stdout.splitlines() if line.startswith("GPU")]
    except (OSError, subprocess.TimeoutExpired):
        info["gpus"] = []
    return info


def _add_roofline(args, result: dict, sweeps: dict) -> None:
    """Goodput against the serving floor and the forecast, at the ceilings the engine sweep
    measured."""
    engine = sweeps.get("engine", {})
    if "ceilings" not in engine or engine.get("gpu") is None or args.traffic != "seed":
        return
    from fleetlm.bench.roofline_check import roofline_line, roofline_report

    dep = engine["deployment"]
    goodput = {name: s["goodput_output_tok_s"] for name, s in sweeps.items()}
    result["roofline"] = report = roofline_report(
        dep["model"], engine["gpu"], engine["ceilings"], goodput, args.traffic,
        weights_dtype=dep["weights_dtype"], kv_dtype=dep["kv_dtype"],
        goodput_rate={name: s["goodput_rate"] for name, s in sweeps.items()},
    )  # fmt: skip
    print(roofline_line(report))


def _print_summary(sweeps: dict, comparison: dict | None) -> None:
    from fleetlm.bench.serve_bench import one_line

    for name, sw in sweeps.items():
        print(f"\n{name}: goodput {sw['goodput_rate']:g} req/s "
              f"({sw['goodput_output_tok_s']:.0f} out tok/s)")  # fmt: skip
        for run in sw["runs"]:
            print(one_line(run))
    if comparison:
        print(f"\nserved ÷ engine: goodput {comparison['goodput_ratio']:.2f}")
        for row in comparison["per_rate"]:
            print(
                f"  {row['rate']:g} req/s: TPOT p50 ×{row['tpot_p50_ratio']:.2f}, "
                f"p95 ×{row['tpot_p95_ratio']:.2f}, TTFT p95 ×{row['ttft_p95_ratio']:.2f}, "
                f"out tok/s ×{row['output_tok_s_ratio']:.2f}"
            )


def _jsonable(x):
    """Plain JSON: NaN → null, numpy values → numbers."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if hasattr(x, "tolist"):
        return _jsonable(x.tolist())
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    return x
