# Rendering a Plan: a table a person reads, or JSON a script reads. The JSON carries every
# number in base SI units (bytes, seconds, FLOP/s); the table rounds and says how it got there.
from __future__ import annotations

import json
import math

from fleetlm.capacity.deployment import dtype_bytes
from fleetlm.capacity.forecast import running_context_tokens
from fleetlm.capacity.plan import Plan
from fleetlm.capacity.roofline import Floor

Row = tuple[str, str, str]


def plan_json(plan: Plan, simulated=None) -> str:
    """The plan as JSON; `simulated`: a SimulatedForecast (fleetlm/capacity/simulated.py)."""

    def finite(x: object) -> object:
        # JSON has no Infinity; an infeasible serving point reports null instead.
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: finite(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [finite(v) for v in x]
        return x

    out = plan.to_dict()
    if simulated is not None:
        out["simulated"] = simulated.to_dict()
    return json.dumps(finite(out), indent=2)


def gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB"


def secs(s: float) -> str:
    if not math.isfinite(s):
        return "n/a"
    value, unit = (s, "s") if s >= 1 else (s * 1e3, "ms") if s >= 1e-3 else (s * 1e6, "µs")
    # About three significant figures: 5.25 ms, 20.5 ms, 800 ms.
    digits = 0 if value >= 100 else 1 if value >= 10 else 2
    return f"{value:,.{digits}f} {unit}"


def flop(n: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} FLOP"


def _intensity(f: Floor) -> str:
    return f"{f.arithmetic_intensity:,.0f} FLOP/B"


def _bound_note(f: Floor) -> str:
    if f.bound != "mixed":
        return f"{f.bound}-bound"
    return f"linear layers {f.linear_bound}-bound, attention {f.attention_bound}-bound"


def _phases(f: Floor) -> str:
    return (
        f"linear {secs(f.linear_s)} ({f.linear_bound}), "
        f"attention {secs(f.attention_s)} ({f.attention_bound})"
    )


def _memory_rows(plan: Plan) -> list[Row]:
    dep, m, mem, wl = plan.deployment, plan.deployment.model, plan.memory, plan.workload
    params = m.num_params()
    wbytes, kvb = dtype_bytes(dep.weights_dtype), dtype_bytes(dep.kv_dtype)
    kv_note = (
        f"{m.num_layers} layers x {m.num_kv_heads} KV heads x {m.head_dim} x 2 (K,V) x {kvb} B"
    )
    if mem.kv_replication > 1:
        kv_note += f", stored {mem.kv_replication}x (more GPUs than KV heads)"
    return [
        ("GPU memory", gb(mem.total_bytes), f"{dep.num_gpus} x {gb(dep.gpu.memory_bytes)}"),
        (
            f"weights ({dep.weights_dtype})",
            gb(mem.weight_bytes),
            f"{params / 1e9:.2f} B params x {wbytes} B; {gb(mem.weight_bytes_per_gpu)} per GPU",
        ),
        ("reserve", gb(mem.reserve_bytes), plan.reserve.describe()),
        ("left for KV", gb(mem.kv_pool_bytes), "memory - weights - reserve"),
        (
            f"KV per token ({dep.kv_dtype})",
            f"{mem.kv_bytes_per_token:,} B",
            f"{mem.kv_bytes_per_token / 1024:,.0f} KiB = {kv_note}",
        ),
        ("KV capacity", f"{mem.kv_tokens:,} tokens", "left for KV / KV per token"),
        (
            "concurrent conversations",
            f"{mem.conversations:,}",
            f"at {mem.mean_context_tokens:,} tokens each "
            f"({wl.mean_input_tokens:,} in + {wl.mean_output_tokens:,} out)",
        ),
        (
            "  with prefix sharing",
            f"<= {mem.conversations_prefix_shared:,}",
            f"{wl.prefix_shared_fraction:.0%} of input tokens shared, stored once",
        ),
        (
            f"longest context ({mem.longest_context_tokens:,})",
            gb(mem.longest_context_bytes),
            f"{mem.longest_context_bytes / mem.kv_pool_bytes:.1%} of the KV pool",
        ),
    ]


def _decode_rows(plan: Plan) -> list[Row]:
    dep, d, d1 = plan.deployment, plan.decode, plan.decode_single
    rows = [
        (
            "step floor",
            secs(d.seconds),
            f"({gb(d.weight_bytes)} weights + {gb(d.kv_bytes)} KV) / "
            f"{dep.bandwidth_bytes_s / 1e12:.2f} TB/s"
            if d.bound == "bandwidth"
            else _phases(d),
        ),
        (
            "TPOT implied",
            secs(d.seconds),
            f"{plan.decode_batch / d.seconds:,.0f} tok/s for the batch",
        ),
        (
            "arithmetic intensity",
            _intensity(d),
            f"ridge {dep.ridge_flop_per_byte:,.0f} FLOP/B: {_bound_note(d)}",
        ),
        ("at batch 1", secs(d1.seconds), f"{_intensity(d1)}; {1 / d1.seconds:,.0f} tok/s alone"),
    ]
    if plan.decode_batch * plan.decode_context > plan.memory.kv_tokens:
        rows.append(("warning", "", "batch x context is more KV than the pool holds"))
    return rows


def _prefill_rows(plan: Plan) -> list[Row]:
    dep, p, wl = plan.deployment, plan.prefill, plan.workload
    rows = [
        (
            "FLOPs",
            flop(p.flops),
            f"2 x {dep.layer_params / 1e9:.1f} B x P + attention 4·L·H·d·P(P+1)/2 "
            f"({flop(p.attention_flops)})",
        ),
        ("floor = TTFT implied", secs(p.seconds), f"{_intensity(p)}: {_bound_note(p)}"),
    ]
    if plan.prefill_cached is not None:
        rows.append(
            (
                f"  with {wl.prefix_shared_fraction:.0%} prefix hit",
                secs(plan.prefill_cached.seconds),
                "only the uncached tail is computed",
            )
        )
    return rows


def _serving_rows(plan: Plan) -> list[Row]:
    s, wl = plan.serving, plan.workload
    if not s.feasible:
        return [("best batch", "none", s.limited_by)]
    return [
        ("best batch", f"{s.batch:,}", f"limited by {s.limited_by}"),
        ("TPOT (decode + chunked prefill)", secs(s.tpot_s), _phases(s.step)),
        ("TTFT floor at that load", secs(s.ttft_s), "one step in flight, then the prompt"),
        (
            "output tok/s per replica",
            f"{s.output_tok_s:,.0f}",
            f"{s.output_tok_s / wl.mean_output_tokens:,.2f} req/s; prompt FLOPs hidden under "
            "the weight read: a bound, not a forecast",
        ),
    ]


def _profile_note(plan: Plan) -> str:
    p = plan.forecast.profile
    note = (
        f"decode {p.decode_efficiency:.0%} of the bandwidth floor, prefill "
        f"{p.prefill_efficiency:.0%} (attention {p.prefill_attention_efficiency:.0%}) of "
        "the matmul peak"
    )
    if p.step_overhead_s:
        note += f", +{secs(p.step_overhead_s)} per step"
    note += ", shared prefixes read once" if p.shared_prefix_decode else ""
    return note + (", long prompts paced" if p.paced_long_prompts else "")


def _forecast_rows(plan: Plan) -> list[Row]:
    dep, f, e, wl = plan.deployment, plan.forecast, plan.economics, plan.workload
    rows: list[Row] = [("engine", "", _profile_note(plan))]
    b = f.best
    if b is None:
        return [*rows, ("rate at the targets", "none", f.limited_by)]
    met = "met" if b.output_tok_s >= wl.target_output_tok_s else "missed"
    floor = plan.serving.output_tok_s
    ctx = running_context_tokens(wl)
    return [
        *rows,
        ("rate at the targets", f"{b.rate_req_s:,.2f} req/s", f"limited by {f.limited_by}"),
        (
            "prefill per request",
            secs(b.prefill_s),
            f"{wl.new_input_tokens:,.0f} uncached tokens on average: "
            f"{b.prefill_share:.0%} of the GPU's time",
        ),
        (
            "decode step",
            secs(b.decode_step_s),
            f"{b.running:,.0f} running (Little's law), {ctx:,.0f} tokens of context each",
        ),
        (
            "TPOT mean / p95",
            f"{secs(b.tpot_mean_s)} / {secs(b.tpot_p95_s)}",
            "steps share the GPU with prompt chunks",
        ),
        ("TTFT p95", secs(b.ttft_p95_s), "the step in flight, then the prompt's own"),
        (
            "KV in use",
            f"{b.kv_tokens_used:,.0f} tokens",
            f"{b.kv_tokens_used / max(plan.memory.kv_tokens, 1):.0%} of the pool",
        ),
        (
            "output tok/s per replica",
            f"{b.output_tok_s:,.0f}",
            f"{b.output_tok_s / floor:.0%} of the floor; target "
            f"{wl.target_output_tok_s:,.0f}: {met}"
            if floor
            else "",
        ),
        (
            f"replicas for {e.target_output_tok_s:,.0f} tok/s",
            f"{e.replicas_for_target}",
            f"{e.replicas_for_target * dep.num_gpus} GPUs at peak",
        ),
    ]


def _cost_rows(plan: Plan) -> list[Row]:
    e, wl = plan.economics, plan.workload
    pr, be = e.prices, e.break_even_utilisation
    return [
        (
            "output tokens per GPU-hour",
            f"{e.output_tokens_per_gpu_hour / 1e6:,.2f} M",
            "flat out at the forecast, 100% busy",
        ),
        (
            "cost per 1M output tokens",
            f"${e.cost_per_m_output:,.3f}" if e.cost_per_m_output is not None else "n/a",
            f"${pr.gpu_hour:.2f}/GPU-hour at {pr.utilisation:.0%} utilisation; input included",
        ),
        (
            "hosted API, per 1M output",
            f"${e.api_cost_per_m_output:,.2f}",
            f"${pr.api_input_per_m:.2f} in / ${pr.api_output_per_m:.2f} out per 1M, "
            f"{wl.mean_input_tokens / wl.mean_output_tokens:g} input tokens per output (assumed)",
        ),
        (
            "hosted API cheaper below",
            "n/a" if be is None else ("always" if be > 1 else f"{be:.1%} utilisation"),
            f"workload needs > {wl.min_utilisation:.0%}",
        ),
    ]


def _sections(plan: Plan) -> list[tuple[str, list[Row]]]:
    wl = plan.workload
    return [
        ("MEMORY", _memory_rows(plan)),
        (
            f"DECODE  batch {plan.decode_batch:,}, {plan.decode_context:,}-token context",
            _decode_rows(plan),
        ),
        (f"PREFILL  one {plan.prompt_tokens:,}-token prompt, alone", _prefill_rows(plan)),
        (
            f"SERVING FLOOR  TTFT < {secs(wl.ttft_target_s)} at {wl.ttft_prompt_tokens:,} "
            f"tokens, TPOT < {secs(wl.tpot_target_s)}",
            _serving_rows(plan),
        ),
        (
            "FORECAST  p95 targets, the GPU's time shared by prefill and decode",
            _forecast_rows(plan),
        ),
        ("COST", _cost_rows(plan)),
    ]


def plan_table(plan: Plan) -> str:
    dep, gpu = plan.deployment, plan.deployment.gpu
    dt = dep.compute_dtype
    lines = [
        f"fleetlm plan: {dep.describe()}, workload {plan.workload.name}",
        f"GPU     {gpu.name}: {gb(gpu.memory_bytes)}, {gpu.bandwidth_bytes_s / 1e12:.2f} TB/s, "
        f"{gpu.peak_flops(dt) / 1e12:,.0f} TFLOP/s dense {dt}",
        f"        source: {gpu.source}",
        f"replica {gb(dep.memory_bytes)}, {dep.bandwidth_bytes_s / 1e12:.2f} TB/s, "
        f"{dep.peak_flops / 1e15:.2f} PFLOP/s {dt}; ridge point "
        f"{dep.ridge_flop_per_byte:,.0f} FLOP/byte",
        "GB = 1e9 bytes, KiB = 1024 bytes. Times are floors (ideal kernels, free all-reduce),",
        "except under FORECAST: an engine at the efficiencies it names (docs/capacity.md).",
    ]
    sections = _sections(plan)
    width = max(len(r[0]) for _, rows in sections for r in rows)
    for title, rows in sections:
        lines += ["", title]
        for label, value, note in rows:
            lines.append(f"  {label:<{width}}  {value:>16}  {note}".rstrip())
    return "\n".join(lines)


def simulated_table(sim) -> str:
    """The SIMULATED section of `fleetlm plan --simulate` (a SimulatedForecast)."""
    engine = ", ".join(f"{k}={v}" for k, v in sim.engine.items()) or "engine defaults"
    lines = [
        "",
        "SIMULATED  the engine's scheduler on a virtual clock",
        f"  (steps priced by {sim.costs}; {engine}; {sim.duration_s:,.0f} s of arrivals a rate)",
    ]
    for p in sorted(sim.probes, key=lambda p: p.rate_req_s):
        mark = "meets" if p.meets else "misses"
        lines.append(
            f"  {p.rate_req_s:8.3g} req/s  {mark:<6}  TTFT p95 {secs(p.ttft_p95_s)}, "
            f"TPOT p95 {secs(p.tpot_p95_s)}, {p.output_tok_s:,.0f} output tok/s"
        )
    best = f"{sim.rate_req_s:.3g} req/s" if sim.best else "none of the rates probed"
    lines.append(f"  rate at the targets: {best}")
    return "\n".join(lines)
