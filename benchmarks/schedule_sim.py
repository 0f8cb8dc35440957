# `python -m benchmarks.schedule_sim`: fleetlm/bench/schedule_sim.py's simulated engine over
# rates of a workload, printed and written as JSON (the report of `fleetlm bench serve`'s shape).
#
#   python -m benchmarks.schedule_sim --costs llama-3.1-70b-fp8-h200 --rates 0.7,1,1.5,2 \
#       --duration 120 [--set step_time_target_s=0.035] [--out sim.json]
#   python -m benchmarks.schedule_sim --fit-trace DIAG/steps-WORKER ...  (a step trace's costs)
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from engine.config import EngineConfig
from fleetlm.bench.latency import Targets, summarize
from fleetlm.bench.schedule_sim import STEP_COSTS, fit_trace, parse_settings, simulate
from fleetlm.bench.workloads import TRAFFIC, generate


def run(args: argparse.Namespace) -> dict:
    costs = (
        fit_trace(args.fit_trace, args.kv_tokens or 330_000)
        if args.fit_trace
        else STEP_COSTS[args.costs]
    )
    config = EngineConfig(model="sim", **parse_settings(args.set))
    targets = Targets()
    result = {"costs": asdict(costs), "engine": parse_settings(args.set), "runs": []}
    for rate in args.rates:
        reqs = generate(TRAFFIC[args.workload], vocab=128_000, seed=args.seed, rate=rate,
                        duration_s=args.duration)  # fmt: skip
        records, steps = simulate(config, costs, reqs, jitter=args.jitter, seed=args.seed)
        report = summarize(records, duration_s=args.duration, warmup_fraction=args.warmup,
                           targets=targets)  # fmt: skip
        result["runs"].append({"rate": rate, "report": report, "steps": steps})
        inter = report["interactive"]
        print(
            f"rate {rate:g}: interactive TTFT p50/p95 "
            f"{inter['ttft_short_prompts_s']['p50']:.3f}/{inter['ttft_short_prompts_s']['p95']:.3f}"
            f" s, TPOT p50/p95 {1e3 * inter['tpot_s']['p50']:.1f}/"
            f"{1e3 * inter['tpot_s']['p95']:.1f} ms, out {report['all']['output_tok_s']:.0f} tok/s,"
            f" running p50 {steps['running_p50']:.0f}, step p99"
            f" {steps['step_ms'].get('p99', 0):.0f} ms, meets {report['meets_targets']}",
            flush=True,
        )
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--costs", choices=sorted(STEP_COSTS), default="llama-3.1-70b-fp8-h200")
    p.add_argument("--fit-trace", help="a step trace's path without .json/.f64 (overrides --costs)")
    p.add_argument("--kv-tokens", type=int, help="the KV pool with --fit-trace")
    p.add_argument("--workload", choices=sorted(TRAFFIC), default="seed")
    p.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[1.0])
    p.add_argument("--duration", type=float, default=120.0, help="seconds of arrivals per rate")
    p.add_argument("--warmup", type=float, default=0.3, help="share of the run left out")
    p.add_argument("--jitter", type=float, default=0.05, help="lognormal sigma of step times")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="an EngineConfig field, e.g. step_time_target_s=0.035")  # fmt: skip
    p.add_argument("--out", help="write the runs as JSON here")
    args = p.parse_args(argv)
    result = run(args)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
