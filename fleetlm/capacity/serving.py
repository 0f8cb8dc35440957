# The best a replica can do on a workload without breaking its latency targets.
#
# Steady state with chunked prefill: every step decodes `batch` sequences and carries along
# the prompt tokens of the requests that replace the ones finishing. Per output token that is
# new_input / mean_output uncached prompt tokens (2,000 × 40% / 400 = 2 for the seed
# workload), so prefill is not free even though decode dominates the clock: it rides in the
# same weight read but adds its FLOPs to the linear layers.
#
# Each sequence gets one token per step, so TPOT is the step time. Throughput is batch / step,
# and both grow with the batch, so the best point is the largest batch that still fits in the
# KV pool, meets the TPOT target and leaves room for the TTFT target.
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from fleetlm.capacity.deployment import Deployment
from fleetlm.capacity.roofline import Floor, causal_pairs, forward_floor, prefill_floor
from fleetlm.capacity.workloads import Workload


def steady_step(dep: Deployment, wl: Workload, batch: int) -> Floor:
    ctx = wl.mean_context_tokens
    prompts = batch / wl.mean_output_tokens  # requests admitted per step, on average
    new, cached = wl.new_input_tokens, wl.cached_input_tokens
    return forward_floor(
        dep,
        tokens=batch + prompts * new,
        logit_tokens=batch + prompts,
        attention_pairs=batch * ctx + prompts * causal_pairs(new, cached),
        kv_read_tokens=batch * ctx + prompts * cached,
        kv_write_tokens=batch + prompts * new,
    )


def ttft_floor_s(dep: Deployment, wl: Workload, batch: int, step: Floor | None = None) -> float:
    # A prompt of the target length with no prefix hit (the worst case the target covers)
    # waits for the step in flight, then prefills with the replica to itself. Queueing
    # behind other prompts is a scheduler question; this is the floor under it.
    step = step or steady_step(dep, wl, batch)
    return step.seconds + prefill_floor(dep, wl.ttft_prompt_tokens).seconds


@dataclass(frozen=True, slots=True)
class ServingPoint:
    batch: int
    tpot_s: float
    ttft_s: float
    output_tok_s: float
    prompt_tok_s: float  # uncached prompt tokens prefilled per second alongside
    limited_by: str
    step: Floor | None

    @property
    def feasible(self) -> bool:
        return self.batch > 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["step"] = self.step.to_dict() if self.step else None
        return d | {"feasible": self.feasible}


def _point(dep: Deployment, wl: Workload, batch: int, limited_by: str) -> ServingPoint:
    step = steady_step(dep, wl, batch)
    tok_s = batch / step.seconds
    return ServingPoint(
        batch=batch,
        tpot_s=step.seconds,
        ttft_s=ttft_floor_s(dep, wl, batch, step),
        output_tok_s=tok_s,
        prompt_tok_s=tok_s * wl.new_input_tokens / wl.mean_output_tokens,
        limited_by=limited_by,
        step=step,
    )


def _infeasible(reason: str) -> ServingPoint:
    return ServingPoint(0, float("inf"), float("inf"), 0.0, 0.0, reason, None)


def best_serving_point(dep: Deployment, wl: Workload, kv_tokens: int) -> ServingPoint:
    kv_batch = kv_tokens // wl.mean_context_tokens
    if kv_batch < 1:
        return _infeasible("KV pool holds less than one conversation")

    def violated(batch: int) -> str | None:
        step = steady_step(dep, wl, batch)
        if step.seconds > wl.tpot_target_s:
            return "TPOT target"
        if ttft_floor_s(dep, wl, batch, step) > wl.ttft_target_s:
            return "TTFT target"
        return None

    first = violated(1)
    if first is not None:
        return _infeasible(f"{first} missed even at batch 1")
    if violated(kv_batch) is None:
        return _point(dep, wl, kv_batch, "KV capacity")
    # Both step time and TTFT grow with the batch: bisect for the last batch that passes.
    lo, hi = 1, kv_batch  # violated(lo) is None, violated(hi) is not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if violated(mid) is None:
            lo = mid
        else:
            hi = mid
    return _point(dep, wl, lo, violated(hi) or "")
