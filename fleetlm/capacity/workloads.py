# A workload is the traffic shape plus the service targets it is sold under. The planner needs
# both: the shape decides how much KV a conversation holds and how much prefill each output
# token drags along; the targets decide how large a batch the replica may run.
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any


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

    def __post_init__(self) -> None:
        if self.mean_input_tokens < 0 or self.mean_output_tokens < 1:
            raise ValueError("a workload needs at least one output token per request")
        if not 0.0 <= self.prefix_shared_fraction < 1.0:
            raise ValueError("prefix_shared_fraction must be in [0, 1)")

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
    ),
}


def get_workload(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}") from None
