# Benchmark workloads as plain data: each request has prompt ids, an exact output length
# (ignore_eos), a priority class and an arrival offset in seconds.
#
# `nano`: nano-vllm's published bench — 256 sequences, input and output lengths uniform in
# [100, 1024], random token ids, all arriving at once.
# `seed`: the design brief's traffic, defined once in SEED_TRAFFIC below and used by both
# `fleetlm bench engine` and `fleetlm bench serve`.
from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass


@dataclass(slots=True)
class BenchRequest:
    prompt_ids: list[int]
    max_tokens: int
    priority: str  # "interactive" | "batch" (service_tier "flex" at the HTTP edge)
    arrival_s: float
    num_shared_tokens: int = 0  # leading prompt tokens taken from a shared system prompt


@dataclass(frozen=True, slots=True)
class TrafficSpec:
    """A traffic shape: shared system prompts + a user part (chat turns with a tail of long
    documents), lognormal output lengths, a priority mix, Poisson arrivals."""

    name: str
    num_system_prompts: int
    system_prompt_tokens: int
    long_doc_fraction: float  # share of requests whose user part is a long document
    long_doc_tokens: tuple[int, int]  # uniform range of a long document's length
    chat_mean_tokens: float  # mean user part of the other requests (lognormal)
    chat_sigma: float
    output_mean_tokens: float  # lognormal, clipped to [output_min, output_max]
    output_sigma: float
    output_min: int
    output_max: int
    interactive_fraction: float
    max_prompt_tokens: int

    def __post_init__(self) -> None:
        if self.num_system_prompts < 1 or self.system_prompt_tokens < 0:
            raise ValueError("need at least one system prompt of non-negative length")
        if not 0.0 <= self.long_doc_fraction <= 1.0 or not 0 < self.interactive_fraction <= 1:
            raise ValueError("fractions must be in [0, 1]")
        lo, hi = self.long_doc_tokens
        if not 0 < lo <= hi:
            raise ValueError("long_doc_tokens must be an increasing positive range")
        if not 1 <= self.output_min <= self.output_max:
            raise ValueError("need 1 <= output_min <= output_max")

    @property
    def mean_prompt_tokens(self) -> float:
        lo, hi = self.long_doc_tokens
        user = self.long_doc_fraction * (lo + hi) / 2
        user += (1 - self.long_doc_fraction) * self.chat_mean_tokens
        return self.system_prompt_tokens + user

    @property
    def shared_fraction(self) -> float:
        return self.system_prompt_tokens / self.mean_prompt_tokens

    def to_dict(self) -> dict:
        return asdict(self) | {
            "mean_prompt_tokens": self.mean_prompt_tokens,
            "shared_fraction": self.shared_fraction,
        }


# The brief: prompts ≈ 2,000 tokens of which ≈ 60 % come from 8 shared 1,200-token system
# prompts, 2 % long documents of 8k–30k tokens (the tail to 32k), outputs ≈ 400 tokens
# (lognormal), 70 % interactive / 30 % batch ("flex"). The chat part's mean makes the whole
# prompt mean 2,000: 1,200 + 0.02 × 19,000 + 0.98 × m = 2,000 → m ≈ 429.
SEED_TRAFFIC = TrafficSpec(
    name="seed",
    num_system_prompts=8,
    system_prompt_tokens=1200,
    long_doc_fraction=0.02,
    long_doc_tokens=(8000, 30000),
    chat_mean_tokens=(800 - 0.02 * 19000) / 0.98,
    chat_sigma=0.8,
    output_mean_tokens=400,
    output_sigma=0.7,
    output_min=8,
    output_max=2048,
    interactive_fraction=0.7,
    max_prompt_tokens=32000,
)
TRAFFIC = {"seed": SEED_TRAFFIC}


def _lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    # E[exp(N(mu, sigma²))] = exp(mu + sigma²/2) = mean
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)


def _token_sampler(rng: random.Random, vocab: int, excluded: frozenset[int]):
    def draw(n: int) -> list[int]:
        out = []
        while len(out) < n:
            t = rng.randrange(vocab)
            if t not in excluded:
                out.append(t)
        return out

    return draw


def generate(
    spec: TrafficSpec,
    *,
    vocab: int,
    seed: int = 0,
    rate: float | None = None,
    duration_s: float | None = None,
    num_requests: int | None = None,
    max_prompt_tokens: int | None = None,
    max_total_tokens: int | None = None,
    excluded_ids: frozenset[int] = frozenset(),
) -> list[BenchRequest]:
    """Requests of `spec`. With `rate`, Poisson arrivals until `duration_s` (or `num_requests`
    requests); without, `num_requests` all arriving at 0. The i-th request's shape (system
    prompt, lengths, priority) depends only on `seed` and i; the tokens of its user part also on
    the rate. Two backends given the same rate get identical requests; the rates of a sweep,
    run one after another on one server, share only the system prompts — with the same user
    parts, every rate after the first found the previous rate's prompts in the prefix cache
    (measured on the H200: cached share 0.86 against 0.58–0.65 for a first rate).
    `max_prompt_tokens` / `max_total_tokens` clip prompts and outputs to a server's context."""
    if rate is None and num_requests is None:
        raise ValueError("all-at-once traffic needs num_requests")
    if rate is not None and rate <= 0:
        raise ValueError("rate must be positive")
    if rate is not None and duration_s is None and num_requests is None:
        raise ValueError("Poisson traffic needs duration_s or num_requests")
    content = random.Random(f"{spec.name}:{seed}:content")
    arrivals = random.Random(f"{spec.name}:{seed}:arrivals:{rate}")
    draw_system = _token_sampler(random.Random(f"{spec.name}:{seed}:tokens"), vocab, excluded_ids)
    systems = [draw_system(spec.system_prompt_tokens) for _ in range(spec.num_system_prompts)]
    draw = _token_sampler(random.Random(f"{spec.name}:{seed}:user:{rate}"), vocab, excluded_ids)
    max_prompt = min(spec.max_prompt_tokens, max_prompt_tokens or spec.max_prompt_tokens)
    out: list[BenchRequest] = []
    t = 0.0
    while num_requests is None or len(out) < num_requests:
        if rate is not None:
            t += arrivals.expovariate(rate)
            if duration_s is not None and t > duration_s:
                break
        system = systems[content.randrange(spec.num_system_prompts)]
        if content.random() < spec.long_doc_fraction:
            user = content.randint(*spec.long_doc_tokens)
        else:
            user = max(1, round(_lognormal(content, spec.chat_mean_tokens, spec.chat_sigma)))
        n_out = round(_lognormal(content, spec.output_mean_tokens, spec.output_sigma))
        n_out = min(spec.output_max, max(spec.output_min, n_out))
        priority = "interactive" if content.random() < spec.interactive_fraction else "batch"
        shared = min(len(system), max_prompt - 1)
        user = min(user, max_prompt - shared)
        prompt = system[:shared] + draw(user)
        if max_total_tokens is not None:
            n_out = max(1, min(n_out, max_total_tokens - len(prompt)))
        out.append(BenchRequest(prompt, n_out, priority, t, num_shared_tokens=shared))
    return out


def nano(num_requests: int = 256, vocab: int = 32000, seed: int = 0) -> list[BenchRequest]:
    rng = random.Random(seed)
    out = []
    for _ in range(num_requests):
        n_in = rng.randint(100, 1024)
        n_out = rng.randint(100, 1024)
        out.append(
            BenchRequest([rng.randrange(vocab) for _ in range(n_in)], n_out, "interactive", 0.0)
        )
    return out


def describe(requests: list[BenchRequest]) -> dict:
    ins = [len(r.prompt_ids) for r in requests]
    outs = [r.max_tokens for r in requests]
    n = max(len(requests), 1)
    return {
        "num_requests": len(requests),
        "mean_input": sum(ins) / n,
        "max_input": max(ins, default=0),
        "mean_output": sum(outs) / n,
        "shared_fraction": sum(r.num_shared_tokens for r in requests) / max(sum(ins), 1),
        "interactive_fraction": sum(r.priority == "interactive" for r in requests) / n,
        "duration_s": max((r.arrival_s for r in requests), default=0.0),
    }
