# Drive an LLMEngine over a workload and report what the brief cares about: output and total
# tok/s, TTFT and TPOT percentiles (from scheduled arrival), the step-time breakdown, GPU idle
# time between steps, KV usage, prefix hits and preemptions; plus the workload's roofline.
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

from fleetlm.bench.workloads import BenchRequest


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": math.nan, "p95": math.nan, "p99": math.nan}
    s = sorted(values)

    def pick(q: float) -> float:
        return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]

    return {"p50": pick(0.50), "p95": pick(0.95), "p99": pick(0.99)}


@dataclass(slots=True)
class _Track:
    arrival: float
    num_prompt: int
    first_token: float | None = None
    finish: float | None = None
    num_out: int = 0
    reason: str | None = None


@dataclass(slots=True)
class _Steps:
    wall: list[float] = field(default_factory=list)
    schedule: list[float] = field(default_factory=list)
    prepare: list[float] = field(default_factory=list)
    forward: list[float] = field(default_factory=list)
    sample: list[float] = field(default_factory=list)
    kv_usage: list[float] = field(default_factory=list)
    num_running: list[int] = field(default_factory=list)


def run_workload(
    engine, requests: list[BenchRequest], *, timeout_s: float = 600.0, detokenize: bool = True
) -> dict:
    import torch

    from engine.sampling_params import SamplingParams

    runner = engine.runner
    cuda = engine.device.type == "cuda"
    runner.step_events = [] if cuda else None
    stats0 = engine.stats()
    pending = sorted(enumerate(requests), key=lambda kv: kv[1].arrival_s)
    tracks: dict[str, _Track] = {}
    steps = _Steps()
    t0 = time.time()
    deadline = t0 + timeout_s
    i = 0
    while i < len(pending) or engine.has_unfinished():
        now = time.time()
        if now > deadline:
            raise TimeoutError(f"workload did not finish within {timeout_s}s")
        while i < len(pending) and t0 + pending[i][1].arrival_s <= now:
            idx, r = pending[i]
            rid = f"bench-{idx}"
            params = SamplingParams(
                temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True, detokenize=detokenize
            )
            arrival = t0 + r.arrival_s
            engine.add_request(rid, r.prompt_ids, params, r.priority, arrival_time=arrival)
            tracks[rid] = _Track(arrival=arrival, num_prompt=len(r.prompt_ids))
            i += 1
        if not engine.has_unfinished():
            time.sleep(max(0.0, min(0.01, t0 + pending[i][1].arrival_s - time.time())))
            continue
        s0 = time.perf_counter()
        deltas = engine.step()
        steps.wall.append(time.perf_counter() - s0)
        steps.schedule.append(engine.last_schedule_s)
        steps.prepare.append(runner.timing.prepare_s)
        steps.forward.append(runner.timing.forward_s)
        steps.sample.append(runner.timing.sample_s)
        st = engine.stats()
        steps.kv_usage.append(st.kv_cache_usage)
        steps.num_running.append(st.num_running)
        for d in deltas:
            tr = tracks[d.request_id]
            tr.num_out = d.usage.completion_tokens
            if d.first_token_time is not None:
                tr.first_token = d.first_token_time
            if d.finished:
                tr.finish = d.finish_time
                tr.reason = d.finish_reason
    elapsed = time.time() - t0
    gpu_busy_s = gpu_span_s = math.nan
    if cuda and runner.step_events:
        torch.cuda.synchronize()
        ev = runner.step_events
        gpu_busy_s = sum(a.elapsed_time(b) for a, b in ev) / 1e3
        gpu_span_s = ev[0][0].elapsed_time(ev[-1][1]) / 1e3
    runner.step_events = None
    stats1 = engine.stats()

    done = list(tracks.values())
    bad = [t.reason for t in done if t.reason != "length"]
    total_out = sum(t.num_out for t in done)
    total_in = sum(t.num_prompt for t in done)
    ttft = [t.first_token - t.arrival for t in done if t.first_token is not None]
    tpot = [(t.finish - t.first_token) / (t.num_out - 1) for t in done if t.num_out > 1]
    queries = stats1.prefix_cache_queries - stats0.prefix_cache_queries
    hits = stats1.prefix_cache_hits - stats0.prefix_cache_hits
    n_steps = len(steps.wall)
    step_total = sum(steps.wall)
    breakdown = {
        "schedule": sum(steps.schedule),
        "prepare": sum(steps.prepare),
        "forward": sum(steps.forward),
        "sample": sum(steps.sample),
    }
    breakdown["host_other"] = step_total - sum(breakdown.values())
    return {
        "num_requests": len(done),
        "detokenize": detokenize,
        "unexpected_finishes": bad,
        "elapsed_s": elapsed,
        "input_tokens": total_in,
        "output_tokens": total_out,
        "output_tok_s": total_out / elapsed,
        "total_tok_s": (total_in + total_out) / elapsed,
        "ttft_s": percentiles(ttft),
        "tpot_s": percentiles(tpot),
        "steps": n_steps,
        "mean_step_ms": 1e3 * step_total / max(n_steps, 1),
        "step_ms": {k: 1e3 * v for k, v in percentiles(steps.wall).items()}
        | {"max": 1e3 * max(steps.wall, default=0.0)},
        "step_breakdown_s": breakdown,
        "step_breakdown_fraction": {k: v / step_total for k, v in breakdown.items()}
        if step_total
        else {},
        "gpu_busy_s": gpu_busy_s,
        "gpu_idle_fraction": 1.0 - gpu_busy_s / gpu_span_s
        if gpu_span_s == gpu_span_s
        else math.nan,
        "kv_usage_mean": statistics.fmean(steps.kv_usage) if steps.kv_usage else 0.0,
        "kv_usage_max": max(steps.kv_usage, default=0.0),
        "max_running": max(steps.num_running, default=0),
        "prefix_hit_rate": hits / queries if queries else 0.0,
        "preemptions": stats1.num_preemptions - stats0.num_preemptions,
    }


def workload_floor_s(
    dep, requests: list[BenchRequest], max_batch: int, cached_fraction: float = 0.0
) -> dict:
    """A lower bound on serving the whole workload at once on `dep` (fleetlm.capacity):
    prefill FLOPs at peak, plus decode steps that each stream the weights once and every running
    sequence's KV. Steps ≥ max(longest output, total output / max_batch)."""
    from fleetlm.capacity.roofline import attention_flops_per_pair, causal_pairs

    bw, peak = dep.bandwidth_bytes_s, dep.peak_flops
    per_token_linear = 2.0 * dep.layer_params
    prefill_flops = 0.0
    kv_read_tokens = 0.0
    for r in requests:
        n_in, n_out = len(r.prompt_ids), r.max_tokens
        cached = cached_fraction * n_in
        new = n_in - cached
        prefill_flops += per_token_linear * new + 2.0 * dep.lm_head_params
        prefill_flops += attention_flops_per_pair(dep) * causal_pairs(new, cached)
        kv_read_tokens += n_out * (n_in + n_out / 2)
    total_out = sum(r.max_tokens for r in requests)
    num_steps = max(max(r.max_tokens for r in requests), math.ceil(total_out / max_batch))
    decode_bytes = num_steps * dep.weight_bytes_read + kv_read_tokens * dep.kv_bytes_per_token
    decode_flops = total_out * (per_token_linear + 2.0 * dep.lm_head_params)
    decode_flops += attention_flops_per_pair(dep) * kv_read_tokens
    prefill_s = prefill_flops / peak
    decode_s = max(decode_bytes / bw, decode_flops / peak)
    floor = prefill_s + decode_s
    return {
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "floor_s": floor,
        "roofline_output_tok_s": total_out / floor,
        "decode_steps": num_steps,
    }
