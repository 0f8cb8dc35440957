# From tokens per second to dollars. GPUs are paid for by the hour whether busy or not, so
# cost per token is the hourly price spread over the tokens actually served: peak throughput
# times utilisation. Input tokens have no separate price here: their prefill time is already
# inside the output rate the serving model computed.
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class Prices:
    gpu_hour: float = 2.5  # $ per GPU-hour
    utilisation: float = 0.6  # share of paid GPU-hours spent serving at the peak rate
    # A hosted API to compare against, $ per 1M tokens. Illustrative defaults, not a quote.
    api_input_per_m: float = 0.60
    api_output_per_m: float = 0.80

    def __post_init__(self) -> None:
        if not 0.0 < self.utilisation <= 1.0:
            raise ValueError("utilisation must be in (0, 1]")
        if self.gpu_hour < 0 or self.api_input_per_m < 0 or self.api_output_per_m < 0:
            raise ValueError("prices cannot be negative")


@dataclass(frozen=True, slots=True)
class Economics:
    output_tok_s_per_replica: float
    output_tokens_per_gpu_hour: float  # flat out, 100% busy
    cost_per_m_output: float | None  # at the given utilisation
    target_output_tok_s: float
    replicas_for_target: int | None
    api_cost_per_m_output: float  # hosted price of 1M output tokens and their input
    break_even_utilisation: float | None  # below it the hosted API is cheaper
    prices: Prices

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def economics(
    output_tok_s: float,
    num_gpus: int,
    *,
    mean_input_tokens: float,
    mean_output_tokens: float,
    target_output_tok_s: float,
    prices: Prices | None = None,
) -> Economics:
    prices = prices or Prices()
    per_gpu_hour = output_tok_s * SECONDS_PER_HOUR / num_gpus
    # A hosted API bills the prompt too; per output token it carries input/output of them.
    api_per_m = prices.api_output_per_m + prices.api_input_per_m * (
        mean_input_tokens / mean_output_tokens
    )
    if per_gpu_hour <= 0:
        return Economics(
            output_tok_s, 0.0, None, target_output_tok_s, None, api_per_m, None, prices
        )
    full_load_per_m = prices.gpu_hour / per_gpu_hour * 1e6
    return Economics(
        output_tok_s_per_replica=output_tok_s,
        output_tokens_per_gpu_hour=per_gpu_hour,
        cost_per_m_output=full_load_per_m / prices.utilisation,
        target_output_tok_s=target_output_tok_s,
        replicas_for_target=math.ceil(target_output_tok_s / output_tok_s),
        api_cost_per_m_output=api_per_m,
        # own cost at utilisation u is full_load / u; equal to the API's at u = full_load / api.
        break_even_utilisation=full_load_per_m / api_per_m if api_per_m > 0 else None,
        prices=prices,
    )
