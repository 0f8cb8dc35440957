# A scripted workload for comparing the overlapped engine with the plain one: staggered
# arrivals, shared prefixes, different max_tokens, stop strings, EOS, stop ids, and aborts
# that fire once a request has streamed a given number of tokens (the same point of its stream
# in both engines, though the overlapped engine streams each token one step later).
from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from engine import LLMEngine, SamplingParams


@dataclass
class Planned:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    arrival_step: int
    abort_after: int | None = None  # abort once this many tokens were streamed (>= 1)


@dataclass
class Result:
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int = 0


def plan(seed: int, *, seeded_sampling: bool, num_requests: int = 14, vocab: int = 500):
    """Requests with prompts of 3-90 tokens (a third share a 40-token prefix), max_tokens
    1-48, arrivals over the first steps. Stops and aborts are added by with_endings()."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, vocab) for _ in range(40)]
    out = []
    for i in range(num_requests):
        n = rng.randrange(3, 90)
        prompt = [rng.randrange(3, vocab) for _ in range(n)]
        if i % 3 == 0:
            prompt = shared + prompt[:20]
        sampling = (
            dict(temperature=0.8, top_p=0.9, top_k=50, seed=1000 + i)
            if seeded_sampling and i % 2
            else dict(temperature=0.0)
        )
        max_tokens = 1 if i == 5 else rng.randrange(2, 48)
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sampling)
        out.append(Planned(f"r{i}", prompt, params, arrival_step=rng.choice([0, 0, 1, 2, 4, 7])))
    return out


def pick_eos(planned: list[Planned], base: dict[str, Result]) -> int:
    """A token from the middle of the longest output of the requests with_endings() lets end
    at EOS, to stand in for the model's EOS id."""
    tokens = max((base[p.request_id].tokens for i, p in enumerate(planned) if i % 5 == 3), key=len)
    return tokens[len(tokens) // 2]


def with_endings(planned: list[Planned], base: dict[str, Result], eos: int) -> list[Planned]:
    """From a plain run without stops: give some requests a stop string taken from their own
    text, a stop id from their own tokens, EOS (`eos` is the engine's EOS id), or an abort
    after a few tokens, so that every kind of ending happens mid-run."""
    out = []
    for i, p in enumerate(planned):
        r = base[p.request_id]
        kw = {}
        if i % 5 == 1 and len(r.text) > 12:
            kw["stop"] = [r.text[len(r.text) // 2 : len(r.text) // 2 + 2]]
        elif i % 5 == 2 and len(r.tokens) > 4:
            kw["stop_token_ids"] = [r.tokens[len(r.tokens) // 2]]
        elif i % 5 == 3 and eos in r.tokens:
            kw["ignore_eos"] = False
        params = replace(p.params, **kw) if kw else p.params
        abort_after = max(1, len(r.tokens) // 3) if i % 5 == 4 and len(r.tokens) > 3 else None
        out.append(Planned(p.request_id, p.prompt, params, p.arrival_step, abort_after))
    return out


def drive(engine: LLMEngine, planned: list[Planned], split: bool = False) -> dict[str, Result]:
    """Run the plan to the end; `split` drives the engine as the GPU worker does (schedule,
    launch, poll step_done, finish)."""
    results: dict[str, Result] = {}
    finished: set[str] = set()
    arrivals = sorted(planned, key=lambda p: p.arrival_step)
    by_id = {p.request_id: p for p in planned}
    step = 0
    while arrivals or engine.has_unfinished():
        while arrivals and arrivals[0].arrival_step <= step:
            p = arrivals.pop(0)
            engine.add_request(p.request_id, p.prompt, p.params)
            results[p.request_id] = Result()
        if split:
            launched = engine.launch_step(engine.schedule_step())
            while not engine.step_done(launched):
                pass
            deltas = engine.finish_step(launched)
        else:
            deltas = engine.step()
        for d in deltas:
            assert d.request_id not in finished, f"{d.request_id}: a delta after its end"
            r = results[d.request_id]
            r.tokens += d.new_token_ids
            r.text += d.new_text
            r.completion_tokens = d.usage.completion_tokens
            if d.finished:
                finished.add(d.request_id)
                r.finish_reason = d.finish_reason
        for rid, r in results.items():
            limit = by_id[rid].abort_after
            if rid not in finished and limit is not None and len(r.tokens) >= limit:
                assert engine.abort(rid)
        step += 1
    return results
