# The engine's scheduler on a virtual clock: prefill-policy studies and forecasts without a GPU.
#
# A workload's requests (fleetlm/bench/workloads.py, `seed` by default) go through the real
# Scheduler, BlockManager, PrefillOrder and PrefillPolicy, built from an EngineConfig by the
# engine's own build_scheduler. No model runs: each step takes the time a step-cost model of a
# measured GPU gives its shape (StepFeatures: decodes, their context, prompt tokens, causal
# pairs) times a lognormal jitter, and every sampled token is one placeholder id, so outputs
# run to their exact lengths as the benchmarks' ignore_eos requests do. The latency-aware
# policy is calibrated on the start-up shapes (engine/runner/step_calibration.py) and then fits
# its cost model online from the simulated times, as the engine does from measured ones.
# Requests come out as fleetlm/bench/latency.py's records: the report has the shape of
# `fleetlm bench serve --backend engine`'s (the bare engine's).
#
# Left out: the served path's Redis queue and the worker's intake (the seat rule, admission),
# overlapped scheduling (a finished request's row rides one step more), the host (the GPU never
# waits for it here), and a step's time beyond its shape (kernel choice by row count, graph or
# eager launch beyond one fixed cost for steps with prompt chunks).
#
# The command: benchmarks/schedule_sim.py. fleetlm plan --simulate runs it on step costs derived
# from the planner's roofline (fleetlm/capacity/simulated.py).
from __future__ import annotations

import json
import math
import random
from collections import deque
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from engine.config import EngineConfig
from engine.core.block_manager import BlockManager
from engine.core.calibration_shapes import calibration_shapes, shape_features
from engine.core.request import Priority, Request
from engine.core.scheduler import build_scheduler
from engine.core.step_cost import StepCostModel, StepFeatures
from engine.sampling_params import SamplingParams
from fleetlm.bench.latency import RequestRecord

PLACEHOLDER_TOKEN = 7  # every sampled token: never an EOS (the requests ignore EOS anyway)


@dataclass(frozen=True, slots=True)
class StepCosts:
    """A step's seconds: fixed + eager·[prompt chunk] + row·decodes + context·Σ decode context
    + token·prompt tokens + pair·causal pairs (the engine's StepCostModel features)."""

    fixed_s: float
    eager_s: float
    row_s: float
    context_s: float
    token_s: float
    pair_s: float
    kv_tokens: int  # the KV pool, in tokens
    source: str

    def __post_init__(self) -> None:
        if min(self.fixed_s, self.eager_s, self.row_s, self.context_s) < 0:
            raise ValueError("step costs must be non-negative")
        if min(self.token_s, self.pair_s) < 0 or self.kv_tokens < 1:
            raise ValueError("step costs must be non-negative and the pool positive")

    def seconds(self, f: StepFeatures) -> float:
        return (
            self.fixed_s + self.eager_s * (f.prefill_tokens > 0) + self.row_s * f.decodes
            + self.context_s * f.decode_context + self.token_s * f.prefill_tokens
            + self.pair_s * f.prefill_pairs
        )  # fmt: skip


# Fit by least squares from the step traces of the 2026-12-05 H200 runs (docs/benchmarks-log.md,
# "GPU runs of 2026-12-05"), which record decodes and prompt tokens but not yet the decode
# context or the pairs: those two come from the decode breakdowns (the decode attention's
# measured ns per key of context at ~2k) and from the prompt tokens' squared term. The pools:
# the engine's at gpu_memory_utilization 0.9.
STEP_COSTS = {
    # serve70_goodput at 0.7-1 req/s: decode-only steps 19.6 ms at 1 decode, +0.35 ms a decode
    # at ~2.4k context (0.17 of it the e4m3 KV at 71 ns a key, decode_breakdown_70b_fp8_
    # 2026-12-05.json); prompt tokens 0.2 ms each (48 % of the measured e4m3 matmul peak).
    "llama-3.1-70b-fp8-h200": StepCosts(
        fixed_s=19.3e-3, eager_s=0.0, row_s=0.18e-3, context_s=71e-9, token_s=0.205e-3,
        pair_s=8e-9, kv_tokens=330_000, source="H200 step trace, 2026-12-05 (serve70_goodput)",
    ),
    # serve8 at 28 req/s: 5.5 ms fixed, +70 µs a decode at ~2.4k context (bf16 KV, 28 ns a
    # key), prompt tokens 27 µs each, 2.5 ms more for a step with a prompt chunk. GPU times:
    # the host set the pace past ~150 running there (steps 29 ms apart at ~200 running against
    # 21 ms of GPU), which this model leaves out.
    "llama-3.1-8b-h200": StepCosts(
        fixed_s=5.5e-3, eager_s=2.5e-3, row_s=3e-6, context_s=28e-9, token_s=27e-6,
        pair_s=0.5e-9, kv_tokens=840_000, source="H200 step trace, 2026-12-05 (serve8, 28 req/s)",
    ),
}  # fmt: skip


def fit_trace(path: str, kv_tokens: int) -> StepCosts:
    """StepCosts from a step trace (PATH.json + PATH.f64, engine/runner/step_trace.py) that
    records decode_context and prefill_pairs: the engine's own least-squares fit over its
    steps' GPU times."""
    meta = json.loads(Path(path + ".json").read_text())
    names = meta["fields"]
    table = np.fromfile(path + ".f64").reshape(-1, len(names))
    col = {name: table[:, i] for i, name in enumerate(names)}
    if "prefill_pairs" not in col:
        raise ValueError(f"{path}: the trace has no decode_context / prefill_pairs fields")
    ok = np.isfinite(col["gpu_s"]) & np.isfinite(col["prefill_pairs"])
    n = int(ok.sum())
    if n < 64:
        raise ValueError(f"{path}: {n} steps with GPU times, too few to fit")
    # one fit over every step, with no earlier fit to anchor it (refits do that online)
    model = StepCostModel(window=n, min_samples=n, refit_every=n)
    for i in np.flatnonzero(ok):
        decodes = int(col["num_decodes"][i])
        features = StepFeatures(
            decodes, int(col["decode_context"][i]), int(col["num_tokens"][i]) - decodes,
            float(col["prefill_pairs"][i]),
        )  # fmt: skip
        model.observe(features, float(col["gpu_s"][i]))
    w = [float(x) for x in model.weights]
    return StepCosts(*w, kv_tokens=kv_tokens, source=f"fit of {path}")


def simulate(
    config: EngineConfig, costs: StepCosts, requests, *, jitter: float = 0.05, seed: int = 0
) -> tuple[list[RequestRecord], dict]:
    """Runs `requests` (BenchRequests) to the end; returns their records (seconds from the
    first arrival's clock 0) and step statistics."""
    now = [0.0]
    bm = BlockManager(max(1, costs.kv_tokens // config.block_size), config.block_size,
                      config.enable_prefix_caching)  # fmt: skip
    scheduler = build_scheduler(config, bm, (), clock=lambda: now[0])
    rng = random.Random(seed)
    policy = scheduler.prefill_policy
    if policy is not None and config.calibrate_step_costs:  # as the engine does at start-up
        shapes = calibration_shapes(config.max_num_batched_tokens, 32_768, config.max_num_seqs)
        policy.model.calibrate([
            (f, costs.seconds(f) * math.exp(rng.gauss(0.0, jitter)))
            for f in (shape_features(*shape) for shape in shapes)
        ])  # fmt: skip
    arrivals = deque(sorted(enumerate(requests), key=lambda ir: ir[1].arrival_s))
    records: dict[str, RequestRecord] = {}
    step_s: list[float] = []
    running: list[int] = []
    while arrivals or scheduler.has_unfinished():
        while arrivals and arrivals[0][1].arrival_s <= now[0]:
            i, b = arrivals.popleft()
            priority = Priority.INTERACTIVE if b.priority == "interactive" else Priority.BATCH
            params = SamplingParams(temperature=0.0, max_tokens=b.max_tokens, ignore_eos=True,
                                    detokenize=False)  # fmt: skip
            scheduler.add_request(
                Request(str(i), b.prompt_ids, params, priority, b.max_tokens, b.arrival_s)
            )
            records[str(i)] = RequestRecord(i, b.priority, b.arrival_s, len(b.prompt_ids))
        out = scheduler.schedule()
        for request in out.failed:
            records[request.request_id].status = f"error:{request.finish_reason}"
        if out.is_empty:
            if not arrivals:
                break  # nothing can run and nothing will arrive: the rest can never start
            now[0] = max(now[0], arrivals[0][1].arrival_s)
            continue
        seconds = costs.seconds(out.features) * math.exp(rng.gauss(0.0, jitter))
        now[0] += seconds
        step_s.append(seconds)
        running.append(len(scheduler.running))
        sampled = [
            PLACEHOLDER_TOKEN
            for r, n in zip(out.requests, out.num_new_tokens)
            if r.num_computed_tokens + n == r.num_tokens
        ]
        if policy is not None:
            policy.observe(out.features, seconds)
        for request in scheduler.update_from_output(out, sampled):
            rec = records[request.request_id]
            if rec.first_token_s is None:
                rec.first_token_s = now[0]
                rec.num_cached = request.num_cached_tokens
            rec.token_times.append(now[0])
            rec.num_output = request.num_output_tokens
            if request.is_finished:
                rec.finish_s = now[0]
                reason = request.finish_reason
                rec.status = "ok" if reason == "length" else f"error:{reason}"
    for rec in records.values():
        if rec.status == "pending":
            rec.status = "error:never_started"
    steps = {
        "steps": len(step_s),
        "busy_s": sum(step_s),
        "step_ms": {q: 1e3 * float(np.percentile(step_s, p)) for q, p in
                    (("p50", 50), ("p95", 95), ("p99", 99), ("max", 100))} if step_s else {},
        "running_p50": float(np.median(running)) if running else 0.0,
        "preemptions": scheduler.num_preemptions,
        "prefix_hit_rate": bm.prefix_cache_hits / max(bm.prefix_cache_queries, 1),
    }  # fmt: skip
    return sorted(records.values(), key=lambda r: r.index), steps


def parse_settings(pairs: list[str]) -> dict:
    """["step_time_target_s=0.035", ...] → EngineConfig keyword arguments."""
    known = {f.name for f in fields(EngineConfig)}
    settings = {}
    for pair in pairs:
        key, _, raw = pair.partition("=")
        if key not in known:
            raise ValueError(f"{key!r} is not an EngineConfig field")
        low = raw.strip().lower()
        if low in ("none", "true", "false"):
            settings[key] = {"none": None, "true": True, "false": False}[low]
        else:
            settings[key] = float(raw) if any(c in raw for c in ".e") else int(raw)
    return settings
