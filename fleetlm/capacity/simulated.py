# The forecast by simulation (`fleetlm plan --simulate`): the engine's own scheduler on a virtual
# clock (fleetlm/bench/schedule_sim.py) over the workload's traffic, each step priced by the
# same roofline and efficiencies as the closed-form FORECAST (forecast.py), the rate bisected to
# the highest that meets the targets.
#
# Why beside the closed form: the closed form models the scheduler (prompts first, documents in
# slices or paced, a step in flight before a prompt) with a few queueing approximations; the
# simulation runs the scheduler itself, with whatever prefill rule the engine settings choose
# (FLEETLM_STEP_TIME_TARGET_S and the rest), documents, prefix hits and KV limits included. Both
# rest on the same efficiencies, which are what measurement calibrates (docs/capacity.md). Given
# a step trace of the engine serving (FLEETLM_WORKER_STEP_TRACE_DIR; `--step-trace`), the steps
# are priced by that trace's own fit instead: the measured ceilings, the engine's overheads in.
#
# A step of d decodes reading c keys in all, with p prompt tokens and q causal attention pairs:
#   t = weights / (bw × decode efficiency) + step overhead + c × KV bytes per token / (bw × eff)
#       + p × 2 × layer params / (matmul peak × prefill efficiency)
#       + q × attention FLOPs per pair / (16-bit peak × prefill attention efficiency)
# (the rows' own matmul FLOPs ride in the weight read: a decode batch is far below the ridge).
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from engine.config import EngineConfig
from fleetlm.bench.latency import Targets, summarize
from fleetlm.bench.schedule_sim import StepCosts, simulate
from fleetlm.bench.workloads import TRAFFIC, generate
from fleetlm.capacity.deployment import Deployment
from fleetlm.capacity.forecast import EngineProfile
from fleetlm.capacity.roofline import attention_flops_per_pair
from fleetlm.capacity.workloads import Workload

PROBES = 7  # simulated rates per forecast: a bracket of two or more, then bisection


def step_costs(dep: Deployment, profile: EngineProfile, kv_tokens: int) -> StepCosts:
    bw = dep.bandwidth_bytes_s * profile.decode_efficiency
    attention_peak = dep.gpu.peak_flops("bf16") * dep.num_gpus
    return StepCosts(
        fixed_s=dep.weight_bytes_read / bw + profile.step_overhead_s,
        eager_s=0.0,
        row_s=0.0,
        context_s=dep.kv_bytes_per_token / bw,
        token_s=2.0 * dep.layer_params / (dep.peak_flops * profile.prefill_efficiency),
        pair_s=attention_flops_per_pair(dep)
        / (attention_peak * profile.prefill_attention_efficiency),
        kv_tokens=kv_tokens,
        source="fleetlm plan: roofline x efficiencies",
    )


@dataclass(frozen=True, slots=True)
class SimulatedPoint:
    rate_req_s: float
    meets: bool
    ttft_p95_s: float  # interactive, prompts under the TTFT target's length
    tpot_p95_s: float
    output_tok_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class SimulatedForecast:
    best: SimulatedPoint | None  # None: no probed rate met the targets
    probes: tuple[SimulatedPoint, ...]
    duration_s: float
    engine: dict  # the EngineConfig settings simulated
    costs: str = "roofline x efficiencies"  # what priced the steps (StepCosts.source)

    @property
    def rate_req_s(self) -> float:
        return self.best.rate_req_s if self.best else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "rate_req_s": self.rate_req_s,
            "best": self.best.to_dict() if self.best else None,
            "probes": [p.to_dict() for p in self.probes],
            "duration_s": self.duration_s,
            "engine": self.engine,
            "costs": self.costs,
        }


def simulated_forecast(
    dep: Deployment,
    wl: Workload,
    kv_tokens: int,
    profile: EngineProfile,
    *,
    first_rate: float,
    engine: dict | None = None,
    duration_s: float = 300.0,
    seed: int = 0,
    costs: StepCosts | None = None,
) -> SimulatedForecast:
    """Bisect the arrival rate, starting at `first_rate` (e.g. the closed-form forecast's).
    costs: the steps' prices when measured (a step trace's fit, schedule_sim.fit_trace); by
    default the roofline × the profile's efficiencies."""
    if wl.name not in TRAFFIC:
        raise ValueError(f"no simulated traffic for workload {wl.name!r}: {', '.join(TRAFFIC)}")
    if first_rate <= 0 or duration_s <= 0:
        raise ValueError("need a positive first rate and duration")
    settings = dict(engine or {})
    config = EngineConfig(model="sim", **settings)
    costs = costs or step_costs(dep, profile, kv_tokens)
    targets = Targets(ttft_s=wl.ttft_target_s, ttft_max_prompt_tokens=wl.ttft_prompt_tokens,
                      tpot_s=wl.tpot_target_s)  # fmt: skip
    probes: list[SimulatedPoint] = []

    def probe(rate: float) -> SimulatedPoint:
        reqs = generate(TRAFFIC[wl.name], vocab=128_000, seed=seed, rate=rate,
                        duration_s=duration_s)  # fmt: skip
        records, _ = simulate(config, costs, reqs, seed=seed)
        report = summarize(records, duration_s=duration_s, warmup_fraction=0.3, targets=targets)
        inter = report["interactive"]
        point = SimulatedPoint(rate, report["meets_targets"],
                               inter["ttft_short_prompts_s"]["p95"], inter["tpot_s"]["p95"],
                               report["all"]["output_tok_s"])  # fmt: skip
        probes.append(point)
        return point

    # Bracket: double or halve from the first rate until the outcome flips, then bisect.
    rate, met, missed = first_rate, None, None
    while len(probes) < PROBES and (met is None or missed is None):
        if probe(rate).meets:
            met = rate
            rate *= 2
        else:
            missed = rate
            rate /= 2
    while len(probes) < PROBES and met is not None and missed is not None:
        mid = (met + missed) / 2
        if probe(mid).meets:
            met = mid
        else:
            missed = mid
    best = max((p for p in probes if p.meets), key=lambda p: p.rate_req_s, default=None)
    return SimulatedForecast(best, tuple(probes), duration_s, settings, costs.source)
