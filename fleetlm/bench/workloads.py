# Benchmark workloads as plain data: each request has prompt ids, an exact output length
# (ignore_eos), a priority class and an arrival offset in seconds.
#
# `nano`: nano-vllm's published bench — 256 sequences, input and output lengths uniform in
# [100, 1024], random token ids, all arriving at once.
# `seed`: the design brief's traffic — prompts averaging ≈2,000 tokens with a long tail to
# 32,000, outputs averaging ≈400, ≈60 % of input tokens from a few shared system prompts,
# 70 % interactive / 30 % batch, Poisson arrivals at `rate` requests/s (or all at once).
from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(slots=True)
class BenchRequest:
    prompt_ids: list[int]
    max_tokens: int
    priority: str
    arrival_s: float


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


def seed_workload(
    num_requests: int = 200,
    rate: float | None = None,
    vocab: int = 32000,
    seed: int = 0,
    num_system_prompts: int = 4,
    max_prompt: int = 32000,
) -> list[BenchRequest]:
    rng = random.Random(seed)
    # Shared system prompts ≈ 1,200 tokens: 60 % of a 2,000-token mean prompt.
    systems = [
        [rng.randrange(vocab) for _ in range(rng.randint(1000, 1400))]
        for _ in range(num_system_prompts)
    ]
    out = []
    t = 0.0
    for _ in range(num_requests):
        system = systems[rng.randrange(num_system_prompts)]
        # User part, mean ≈ 800: 3 % long documents (6k–30k tokens, the tail to 32k), the rest
        # lognormal chat turns with mean ≈ 270.
        if rng.random() < 0.03:
            user = rng.randint(6000, 30000)
        else:
            user = max(8, int(rng.lognormvariate(math.log(194), 0.8)))
        user = min(user, max_prompt - len(system))
        prompt = system + [rng.randrange(vocab) for _ in range(user)]
        n_out = int(min(2048, max(16, rng.expovariate(1 / 400))))
        priority = "interactive" if rng.random() < 0.7 else "batch"
        if rate:
            t += rng.expovariate(rate)
        out.append(BenchRequest(prompt, n_out, priority, t))
    return out


def describe(requests: list[BenchRequest]) -> dict:
    ins = [len(r.prompt_ids) for r in requests]
    outs = [r.max_tokens for r in requests]
    return {
        "num_requests": len(requests),
        "mean_input": sum(ins) / len(ins),
        "max_input": max(ins),
        "mean_output": sum(outs) / len(outs),
        "interactive_fraction": sum(r.priority == "interactive" for r in requests) / len(requests),
    }
