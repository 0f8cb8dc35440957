# A workload is the traffic shape plus the service targets it is sold under. The planner needs
# both: the shape decides how much KV a conversation holds and how much prefill each output
# token drags along; the targets decide how large a batch the replica may run.
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from statistics import NormalDist
from typing import Any

# (share of requests, uncached prompt tokens, cached prompt tokens)
PromptClass = tuple[float, float, float]


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    mean_input_tokens: int
    mean_output_tokens: int
    max_context_tokens: int
    # Fraction of input tokens served from the prefix cache (shared system prompts, earlier
    # turns). They cost no prefill FLOPs; their KV blocks are shared between conversations.
    prefix_shared_fraction: float
    ttft_target_s: float
    ttft_prompt_tokens: int  # the TTFT target applies to prompts up to this long
    tpot_target_s: float
    target_output_tok_s: float  # per replica
    min_utilisation: float  # share of paid GPU-hours that must be busy
    # The spread the forecast needs (fleetlm/capacity/forecast.py); the defaults make every
    # request the mean one. The shared part of a prompt is `shared_prefixes` system prompts
    # of cached_input_tokens each; the uncached part is a long document (uniform in
    # long_prompt_tokens) for long_prompt_fraction of requests and lognormal otherwise.
    shared_prefixes: int = 1
    long_prompt_fraction: float = 0.0
    long_prompt_tokens: tuple[int, int] = (0, 0)
    prompt_sigma: float = 0.0  # lognormal sigma of the other requests' uncached tokens
    output_sigma: float = 0.0  # lognormal sigma of output lengths

    def __post_init__(self) -> None:
        if self.mean_input_tokens < 0 or self.mean_output_tokens < 1:
            raise ValueError("a workload needs at least one output token per request")
        if not 0.0 <= self.prefix_shared_fraction < 1.0:
            raise ValueError("prefix_shared_fraction must be in [0, 1)")
        if self.shared_prefixes < 1 or self.prompt_sigma < 0 or self.output_sigma < 0:
            raise ValueError("shared_prefixes must be >= 1 and sigmas >= 0")
        lo, hi = self.long_prompt_tokens
        if not 0.0 <= self.long_prompt_fraction < 1.0 or not 0 <= lo <= hi:
            raise ValueError("long_prompt_fraction must be in [0, 1), long_prompt_tokens a range")
        if self.long_prompt_fraction * (lo + hi) / 2 > self.new_input_tokens:
            raise ValueError("the long-prompt tail is larger than the uncached input")

    @property
    def mean_context_tokens(self) -> int:
        # What a conversation holds when its last token is generated. The scheduler has to be
        # able to grow every running sequence to this, so capacity is counted at it.
        return self.mean_input_tokens + self.mean_output_tokens

    @property
    def new_input_tokens(self) -> float:
        return self.mean_input_tokens * (1.0 - self.prefix_shared_fraction)

    @property
    def cached_input_tokens(self) -> float:
        return self.mean_input_tokens * self.prefix_shared_fraction

    def prompt_mix(self, points: int = 16) -> list[PromptClass]:
        """The prompts as a discrete distribution whose mean uncached length is exact."""
        f, (lo, hi) = self.long_prompt_fraction, self.long_prompt_tokens
        cached = self.cached_input_tokens
        tail = [(lo + (hi - lo) * (i + 0.5) / points) for i in range(points)] if f else []
        body_mean = (self.new_input_tokens - f * (lo + hi) / 2) / (1 - f)
        body = _lognormal_points(body_mean, self.prompt_sigma, points)
        mix = [((1 - f) * w, n, cached) for w, n in body]
        return mix + [(f / points, n, cached) for n in tail]

    def output_mix(self, points: int = 16) -> list[tuple[float, float]]:
        return _lognormal_points(self.mean_output_tokens, self.output_sigma, points)

    def with_overrides(self, **kw: Any) -> Workload:
        return replace(self, **{k: v for k, v in kw.items() if v is not None})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"mean_context_tokens": self.mean_context_tokens}


WORKLOADS: dict[str, Workload] = {
    # The brief's launch traffic: chat and agent calls, 2,000 in / 400 out on average with a
    # long tail to 32,000, ~60% of input tokens shared. Targets: TTFT p95 < 800 ms for prompts
    # under 4,000 tokens, TPOT p95 < 40 ms, ≥ 8,000 output tok/s per four-GPU replica, and
    # more than 60% of GPU-hours busy.
    "seed": Workload(
        name="seed",
        mean_input_tokens=2000,
        mean_output_tokens=400,
        max_context_tokens=32000,
        prefix_shared_fraction=0.6,
        ttft_target_s=0.8,
        ttft_prompt_tokens=4000,
        tpot_target_s=0.040,
        target_output_tok_s=8000.0,
        min_utilisation=0.6,
        # The shape `fleetlm bench`'s seed traffic draws (fleetlm/bench/workloads.py): 8
        # system prompts, 2% documents of 8k-30k tokens, chat turns and outputs lognormal.
        shared_prefixes=8,
        long_prompt_fraction=0.02,
        long_prompt_tokens=(8000, 30000),
        prompt_sigma=0.8,
        output_sigma=0.7,
    ),
}


def _lognormal_points(mean: float, sigma: float, points: int) -> list[tuple[float, float]]:
    # Equal-weight quantile midpoints of a lognormal, rescaled so their mean is `mean`.
    if sigma == 0 or mean <= 0:
        return [(1.0, mean)]
    z = [NormalDist().inv_cdf((i + 0.5) / points) for i in range(points)]
    xs = [math.exp(sigma * zi) for zi in z]
    scale = mean / (sum(xs) / points)
    return [(1 / points, x * scale) for x in xs]


def get_workload(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}") from None
