# `fleetlm plan`: size a replica for a model and workload. Pure arithmetic (--simulate adds the
# engine's scheduler on a virtual clock); imports no torch.
# CLI units are the ones people quote (GB, TB/s, TFLOP/s, ms); the Python API uses SI.
from __future__ import annotations

import argparse
import sys

from engine.models.config import PRESETS
from fleetlm.capacity import (
    DTYPE_BYTES,
    GPUS,
    WORKLOADS,
    Deployment,
    EngineProfile,
    Prices,
    Reserve,
    get_workload,
    make_plan,
    plan_json,
    plan_table,
    simulated_table,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan",
        help="GPU memory, latency floors, throughput and cost for a model on a replica",
        description="Capacity arithmetic for one tensor-parallel replica: floors from bytes "
        "moved and FLOPs done, and a forecast of what an engine at measured efficiencies "
        "serves under the targets (docs/capacity.md).",
    )
    dtypes = sorted(DTYPE_BYTES)
    p.add_argument("--model", required=True, help=f"preset ({', '.join(PRESETS)}) or HF dir")
    p.add_argument("--weights-dtype", choices=dtypes, default="bf16")
    p.add_argument("--kv-dtype", choices=dtypes, default="bf16")
    p.add_argument("--gpus", default="1xH100", help=f"COUNTxGPU, GPU one of {', '.join(GPUS)}")
    p.add_argument("--workload", default="seed", choices=sorted(WORKLOADS))
    p.add_argument("--json", action="store_true", help="print JSON (SI units) instead of a table")

    hw = p.add_argument_group("measured hardware (per GPU; replaces the datasheet figure)")
    hw.add_argument("--bandwidth", type=float, metavar="TB/s", help="sustained HBM bandwidth")
    hw.add_argument("--flops", type=float, metavar="TFLOP/s", help="sustained dense matmul rate")
    hw.add_argument("--fp8-flops", type=float, metavar="TFLOP/s", help="sustained FP8 matmul rate")
    hw.add_argument("--memory", type=float, metavar="GB", help="usable memory")

    res = p.add_argument_group("memory reserve (per GPU)")
    res.add_argument(
        "--memory-utilisation",
        type=float,
        default=Reserve().memory_utilisation,
        help="share of each GPU the engine may use (default %(default)s)",
    )
    res.add_argument(
        "--runtime-reserve-gb",
        type=float,
        default=Reserve().runtime_bytes_per_gpu / 1e9,
        help="CUDA context, NCCL, graphs, activations (default %(default)s)",
    )

    at = p.add_argument_group("where to evaluate the floors")
    at.add_argument("--batch", type=int, help="decode batch (default: what the KV pool holds)")
    at.add_argument("--context", type=int, help="decode context (default: workload mean)")
    at.add_argument("--prompt-tokens", type=int, help="prefill prompt (default: TTFT target's)")

    d = EngineProfile()
    eng = p.add_argument_group("the engine the forecast assumes (defaults: measured, H200)")
    eng.add_argument(
        "--decode-efficiency",
        type=float,
        default=d.decode_efficiency,
        help="decode step's share of its bandwidth floor (default %(default)s)",
    )
    eng.add_argument(
        "--prefill-efficiency",
        type=float,
        default=d.prefill_efficiency,
        help="prompt matmuls' share of the matmul peak (default %(default)s)",
    )
    eng.add_argument(
        "--prefill-attention-efficiency",
        type=float,
        default=d.prefill_attention_efficiency,
        help="prompt attention's share of the 16-bit peak (default %(default)s)",
    )
    eng.add_argument(
        "--step-overhead-ms",
        type=float,
        default=d.step_overhead_s * 1e3,
        help="fixed cost per decode step (default %(default)s)",
    )
    eng.add_argument(
        "--shared-prefix-decode",
        action="store_true",
        help="decode attention reads a shared prefix's KV once per step",
    )
    eng.add_argument(
        "--paced-long-prompts",
        action="store_true",
        help="long prompts prefilled at a bounded share of every step, not slice after slice",
    )
    eng.add_argument(
        "--chunk-tokens",
        type=int,
        default=d.chunk_tokens,
        help="a long prompt's slice per step (default %(default)s)",
    )

    sim = p.add_argument_group("the forecast by simulation (fleetlm/capacity/simulated.py)")
    sim.add_argument(
        "--simulate",
        action="store_true",
        help="also run the engine's scheduler on a virtual clock, steps priced as FORECAST's, "
        "and bisect the rate (minutes: one simulated run per probed rate)",
    )
    sim.add_argument(
        "--simulate-seconds",
        type=float,
        default=300.0,
        help="seconds of arrivals per simulated rate (default %(default)s)",
    )
    sim.add_argument(
        "--step-trace",
        metavar="PATH",
        help="price the simulated steps by this step trace's fit (PATH without .json/.f64, as "
        "the worker writes it under FLEETLM_WORKER_STEP_TRACE_DIR) instead of FORECAST's",
    )
    sim.add_argument(
        "--engine-set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="an engine setting for the simulation, e.g. step_time_target_s=0.03",
    )

    slo = p.add_argument_group("targets (default: the workload's)")
    slo.add_argument("--ttft-ms", type=float)
    slo.add_argument("--tpot-ms", type=float)
    slo.add_argument("--target-tok-s", type=float, help="output tok/s the fleet must serve")

    money = p.add_argument_group("cost")
    money.add_argument("--price-per-gpu-hour", type=float, default=Prices().gpu_hour)
    money.add_argument(
        "--utilisation",
        type=float,
        default=Prices().utilisation,
        help="share of paid GPU-hours busy (default %(default)s)",
    )
    money.add_argument(
        "--api-price-in",
        type=float,
        default=Prices().api_input_per_m,
        metavar="$/1M",
        help="hosted API input price to compare against",
    )
    money.add_argument(
        "--api-price-out",
        type=float,
        default=Prices().api_output_per_m,
        metavar="$/1M",
        help="hosted API output price to compare against",
    )
    p.set_defaults(func=run)


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value * scale


def run(args: argparse.Namespace) -> int:
    try:
        dep = Deployment.create(
            args.model,
            args.gpus,
            weights_dtype=args.weights_dtype,
            kv_dtype=args.kv_dtype,
            bandwidth_bytes_s=_scaled(args.bandwidth, 1e12),
            flops=_scaled(args.flops, 1e12),
            memory_bytes=_scaled(args.memory, 1e9),
            fp8_flops=_scaled(args.fp8_flops, 1e12),
        )
        profile = EngineProfile(
            decode_efficiency=args.decode_efficiency,
            prefill_efficiency=args.prefill_efficiency,
            prefill_attention_efficiency=args.prefill_attention_efficiency,
            step_overhead_s=args.step_overhead_ms * 1e-3,
            shared_prefix_decode=args.shared_prefix_decode,
            chunk_tokens=args.chunk_tokens,
            paced_long_prompts=args.paced_long_prompts,
        )
        workload = get_workload(args.workload).with_overrides(
            ttft_target_s=_scaled(args.ttft_ms, 1e-3),
            tpot_target_s=_scaled(args.tpot_ms, 1e-3),
        )
        plan = make_plan(
            dep,
            workload,
            reserve=Reserve(args.memory_utilisation, args.runtime_reserve_gb * 1e9),
            prices=Prices(
                args.price_per_gpu_hour, args.utilisation, args.api_price_in, args.api_price_out
            ),
            batch=args.batch,
            context=args.context,
            prompt_tokens=args.prompt_tokens,
            target_output_tok_s=args.target_tok_s,
            profile=profile,
        )
        simulated = None
        if args.step_trace and not args.simulate:
            raise ValueError("--step-trace prices the simulation: add --simulate")
        if args.simulate:  # imported here: the plain plan stays pure arithmetic
            from fleetlm.bench.schedule_sim import fit_trace, parse_settings
            from fleetlm.capacity.simulated import simulated_forecast

            measured = None
            if args.step_trace:  # the pool stays the plan's: the trace has its own machine's
                measured = fit_trace(args.step_trace, plan.memory.kv_tokens)
            simulated = simulated_forecast(
                plan.deployment,
                workload,
                plan.memory.kv_tokens,
                profile,
                first_rate=plan.forecast.rate_req_s or 1.0,
                engine=parse_settings(args.engine_set),
                duration_s=args.simulate_seconds,
                costs=measured,
            )
    except (ValueError, OSError) as e:
        print(f"fleetlm plan: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(plan_json(plan, simulated))
    else:
        print(plan_table(plan) + (simulated_table(simulated) if simulated else ""))
    return 0
