# Drive an LLMEngine over a workload and report what the brief cares about: output and total
# tok/s, TTFT and TPOT percentiles (from scheduled arrival), the step-time breakdown, GPU idle
# time between steps, KV usage, prefix hits and preemptions; plus the workload's roofline.
# GPU idle comes two ways: 1 - GPU busy time / the host's span of the run, and the gaps on the
# GPU's own clock between one step's last kernel and the next one's first (what overlapped
# scheduling removes).
from __future__ import annotations

import math
import time

import numpy as np

from fleetlm.bench.latency import RequestRecord, percentiles
from fleetlm.bench.workloads import BenchRequest


def run_workload(
    engine,
    requests: list[BenchRequest],
    *,
    timeout_s: float = 600.0,
    detokenize: bool = True,
    keep_records: bool = False,
) -> dict:
    """Replay `requests` at their arrival offsets (a request joins at the first step boundary
    after its arrival) and report on the whole run; with keep_records, the per-request records
    (fleetlm.bench.latency) and the step trace's columns come back too."""
    from engine.runner.step_trace import gpu_idle_between_steps
    from engine.sampling_params import SamplingParams

    trace = engine.enable_step_trace()
    stats0 = engine.stats()
    pending = sorted(enumerate(requests), key=lambda kv: kv[1].arrival_s)
    records: dict[str, RequestRecord] = {}
    t0 = time.time()
    deadline = t0 + timeout_s
    i = 0
    try:
        while i < len(pending) or engine.has_unfinished():
            now = time.time()
            if now > deadline:
                raise TimeoutError(f"workload did not finish within {timeout_s}s")
            while i < len(pending) and t0 + pending[i][1].arrival_s <= now:
                idx, r = pending[i]
                rid = f"bench-{idx}"
                params = SamplingParams(
                    temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True,
                    detokenize=detokenize,
                )  # fmt: skip
                engine.add_request(
                    rid, r.prompt_ids, params, r.priority, arrival_time=t0 + r.arrival_s
                )
                records[rid] = RequestRecord(idx, r.priority, r.arrival_s, len(r.prompt_ids))
                i += 1
            if not engine.has_unfinished():
                time.sleep(max(0.0, min(0.01, t0 + pending[i][1].arrival_s - time.time())))
                continue
            deltas = engine.step()
            for d in deltas:
                rec = records[d.request_id]
                if d.new_token_ids:
                    rec.token_times.append(time.time() - t0)
                rec.num_output = d.usage.completion_tokens
                rec.num_cached = d.usage.cached_tokens
                if d.first_token_time is not None and rec.first_token_s is None:
                    rec.first_token_s = d.first_token_time - t0
                    # The engine is all server: its queue and TTFT from the request's arrival,
                    # to set beside a served run's (fleetlm/bench/latency.py).
                    rec.server_ttft_s = rec.first_token_s - rec.arrival_s
                    if d.first_scheduled_time is not None:
                        rec.server_queue_s = d.first_scheduled_time - t0 - rec.arrival_s
                if d.finished:
                    rec.finish_s = d.finish_time - t0
                    rec.status = "ok" if d.finish_reason == "length" else f"error:{d.finish_reason}"
        elapsed = time.time() - t0
        steps = trace.columns()
    finally:
        engine.disable_step_trace()
    stats1 = engine.stats()

    done = list(records.values())
    total_out = sum(r.num_output for r in done)
    total_in = sum(r.num_prompt for r in done)
    ttft = [r.first_token_s - r.arrival_s for r in done if r.first_token_s is not None]
    tpot = [
        (r.finish_s - r.first_token_s) / (r.num_output - 1)
        for r in done
        if r.num_output > 1 and r.finish_s is not None
    ]
    queries = stats1.prefix_cache_queries - stats0.prefix_cache_queries
    hits = stats1.prefix_cache_hits - stats0.prefix_cache_hits
    wall = steps["wall_s"]
    step_total = float(wall.sum())
    parts = ("schedule", "prepare", "forward", "sample", "wait", "post")
    breakdown = {k: float(steps[f"{k}_s"].sum()) for k in parts}
    breakdown["host_other"] = step_total - sum(breakdown.values())
    gpu = steps["gpu_s"][np.isfinite(steps["gpu_s"])]
    span = float(steps["start"][-1] + wall[-1] - steps["start"][0]) if len(wall) else 0.0
    result = {
        "num_requests": len(done),
        "detokenize": detokenize,
        "unexpected_finishes": [r.status for r in done if r.status != "ok"],
        "elapsed_s": elapsed,
        "input_tokens": total_in,
        "output_tokens": total_out,
        "output_tok_s": total_out / elapsed,
        "total_tok_s": (total_in + total_out) / elapsed,
        "ttft_s": percentiles(ttft),
        "tpot_s": percentiles(tpot),
        "steps": len(wall),
        "mean_step_ms": 1e3 * step_total / max(len(wall), 1),
        "step_ms": {k: 1e3 * v for k, v in percentiles(wall.tolist()).items()}
        | {"max": 1e3 * float(wall.max(initial=0.0))},
        "step_breakdown_s": breakdown,
        "step_breakdown_fraction": {k: v / step_total for k, v in breakdown.items()}
        if step_total
        else {},
        "gpu_busy_s": float(gpu.sum()) if gpu.size else math.nan,
        # GPU intervals run from the end of the host's batch packing to the step's last kernel.
        "gpu_idle_fraction": 1.0 - float(gpu.sum()) / span if gpu.size and span else math.nan,
        "gpu_idle_between_steps": gpu_idle_between_steps(steps),
        # ... over the steps that ran with the most sequences (nano: all 256 at once)
        "gpu_idle_at_max_running": gpu_idle_between_steps(_at_max_running(steps)),
        "overlap_scheduling": engine.overlap is not None,
        "overlapped_steps": float(steps["overlapped"].mean()) if len(wall) else 0.0,
        # the host's time to schedule and launch a step; overlapped, it hides under the GPU's
        "host_prepare_ms": {k: 1e3 * v for k, v in percentiles(steps["host_s"].tolist()).items()},
        "kv_usage_mean": float(steps["kv_usage"].mean()) if len(wall) else 0.0,
        "kv_usage_max": float(steps["kv_usage"].max(initial=0.0)),
        "max_running": int(steps["num_running"].max(initial=0)),
        "prefix_hit_rate": hits / queries if queries else 0.0,
        "preemptions": stats1.num_preemptions - stats0.num_preemptions,
        "kernel_compiles": stats1.kernel_compiles - stats0.kernel_compiles,
    }
    if keep_records:
        result["records"] = [records[f"bench-{idx}"] for idx, _ in pending]
        result["step_columns"] = steps
        result["start_time"] = t0
    return result


def _at_max_running(steps: dict) -> dict:
    running = steps["num_running"]
    keep = running == running.max(initial=0)
    return {name: col[keep] for name, col in steps.items()}


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
