# Overload: refuse at admission what the fleet cannot start in time, so that overload shows up
# as 503s, never as admitted requests that wait past their deadline or streams that crawl.
#
# A request's predicted time to first token counts every request admitted and not yet started
# anywhere: the tokens queued in Redis (fleetlm:q:{priority}:tokens: prompt plus expected output
# of each entry no worker has read) and the work waiting in the engines' own queues (each worker
# publishes it, priced, in its stats). It is priced with the workers' step prices
# (workers/gpu/step_prices.py, fit on the model actually loaded): a prompt token and an output token
# (at the running set the TPOT target allows) cost different amounts of a worker's time. Work
# the fleet can start at once (each worker's `startable`: the seats and KV it has free at the TPOT
# target, workers/gpu/intake_budget.py; for flex the room it takes flex in, less the spare it keeps
# for interactive arrivals) waits for nothing; the rest waits for the running requests
# to make room, at the pace the fleet works (one second of work per second per worker):
#
#   wait  = max(0, work ahead + k × the mean request's work - startable × the mean request's
#           work) / pace, k = max(1, the request's KV (prompt and expected output) over the
#           mean request's): a long request waits until k mean requests could start
#   pace  = the priced workers for interactive; for flex Σ (1 - interactive_share) over them,
#           the share of each worker's seats interactive work holds or waits for lately
#           (workers/gpu/load_report.py): interactive arrivals keep overtaking a queued flex
#           request, which gets only what they leave (on an H200, counting the work ahead
#           alone admitted flex for a 30 s bound that then waited 53-89 s)
#   seat  = for interactive, at least the wait for a seat by the workers' seat schedules
#           (workers/gpu/seat_schedule.py): the (over + queued + 1)-th end among their running
#           interactive requests. Requests admitted together end together, then no seat frees
#           for a while: on an H200 the 8B's worst first tokens waited 1.8 s for a seat at 256
#           running against work-model forecasts of 0.4-0.7 s
#   TTFT  = max(wait, hold) + first token, on the worker that gets it out soonest:
#   first = turns × prefill_step_s + seconds of the prompt tokens ahead + of its own
#           + decode_step_s (the turn that delivers the token)
#   turns = ⌈(prompt tokens ahead + its own) / prefill_chunk_tokens⌉ (a long prompt's, of
#           prefill_hold_tokens or more, with a step-time target: prefill_long_chunk_tokens)
#   hold  = with a step-time target (engine/core/step_cost.py's PrefillPolicy), how long the
#           engine spreads a short interactive prompt toward its deadline while decodes run
#           before it gives it whole steps (prefill_ttft_guard_s, counted from the enqueue);
#           0 without one. On the H200 such prompts' first tokens clustered at the hold plus
#           the fastest prefill (0.41 s against a forecast of 0.12-0.16 s without the hold)
#
# The prefill term prices prompts as the engine schedules them (workers/gpu/intake_budget.py
# publishes the numbers): in chunks of at most the step's token budget less the running set's
# decodes, every chunk in a turn that also carries those decodes (prefill_step_s: a 70B's turn
# with ~80 running rows costs ~35 ms before its chunk's tokens). Prompt tokens ahead: the
# engine's running prompts and waiting requests of the priority or higher and the prompts
# queued ahead of it in Redis (a share per worker), when the request is seated at once
# (wait = 0); seated later, those took the seats freed before its own and were prefilled
# meanwhile. A queued prompt is priced by the mean share the prefix cache did not hold
# (mean_uncached_prompt_tokens, from the finished requests' cached tokens).
#
# Interactive counts interactive work only: workers take it first and the engine gives it the
# seats and KV of running batch requests, so flex never pushes it back. Flex (service_tier
# "flex", the batch priority) waits behind both, against its own, longer bound. Over the bound
# → 503 `overloaded` with a Retry-After of the time the backlog needs to fall back under it. A
# long prompt (a document, no TTFT target) is held to the bound plus its own prefill with nothing
# ahead (LoadShedder.bound).
# The refusal's reason (in /metrics) is `kv` when the fleet's workers are out of KV headroom,
# `ttft` otherwise. Before any worker is priced (a fresh fleet), the fallback is the queued
# tokens over the workers' measured tokens per second; with nothing measured nothing is shed
# (the queue-length bound, max_queue_len, still holds).
#
# Each API process reads the load at most every load_refresh_s (one Lua call and one pipeline),
# so admission itself stays one Redis round trip; what it admits in between is added to the load
# it holds, so a burst between two reads is not admitted as if each request were alone.
from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from dataclasses import dataclass

from prometheus_client import Counter, Histogram
from redis.asyncio import Redis

from api.relay import live_workers
from service import streams as p
from service.admission import DEFAULT_OUTPUT_TOKENS, DEFAULT_PROMPT_TOKENS, queued_tokens
from service.errors import APIError
from service.queue_ownership import queued_tokens_call
from service.queued_request import QueuedRequest
from service.settings import Settings

# Registered in api/metrics.py's registry (which imports this module through the app state).
PREDICTED_TTFT = Histogram(
    "fleetlm:predicted_ttft_seconds", "Predicted time to first token at admission.",
    ["priority"], registry=None,
    buckets=(0.1, 0.25, 0.5, 0.8, 1.0, 1.6, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0),
)  # fmt: skip
OVERLOAD_REFUSALS = Counter(
    "fleetlm:overload_refusals", "Requests refused with 503 overloaded, by what holds the "
    "line: ttft (the predicted time to first token) or kv (no worker has KV headroom).",
    ["priority", "reason"], registry=None,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """One priced worker's stats (workers/gpu/intake_budget.py)."""

    prefill_token_s: float
    decode_token_s: float
    startable: dict[str, int]  # priority → queue entries it may take now
    waiting_work_s: dict[str, float]  # priority → seconds of work in its engine's waiting queue
    limited_by: str  # waiting | seats | kv
    decode_step_s: float = 0.0  # its running set's decode turn
    # Its prefill as scheduled (chunks beside the running set's decodes); None: not published
    prefill_step_s: float | None = None  # a prompt-carrying turn, less its chunk's tokens
    prefill_chunk_tokens: int = 1  # prompt tokens a turn carries
    prefill_long_chunk_tokens: int = 0  # ... of a long prompt (0: not published, the above)
    prefill_tok_s: float = 0.0  # per prompt token
    prefill_pair_s: float = 0.0  # per causal attention pair
    prefill_ahead_tokens: dict[str, int] = dataclasses.field(default_factory=dict)
    prefill_ahead_s: dict[str, float] = dataclasses.field(default_factory=dict)
    # With a step-time target the engine spreads a short interactive prompt (under
    # prefill_hold_tokens) toward its deadline until it has waited prefill_hold_s since it was
    # enqueued, then gives it whole steps: its first token comes no sooner than that
    prefill_hold_s: float = 0.0
    prefill_hold_tokens: int = 0
    interactive_share: float = 0.0  # of its seats interactive work holds or waits for, lately
    # When its running interactive requests are expected to end (ascending, seconds from now),
    # and how many interactive requests it holds beyond its seats (negative: seats free);
    # None: not published (workers/gpu/seat_schedule.py)
    seat_finish_s: tuple[float, ...] = ()
    seat_over: int | None = None

    def held_s(self, priority: str, prompt_tokens: int) -> float:
        """How long the engine may spread this request's prompt while decodes run."""
        if priority != "interactive" or prompt_tokens >= self.prefill_hold_tokens:
            return 0.0
        return self.prefill_hold_s if self.decode_step_s > 0 else 0.0

    def first_token_s(
        self, priority: str, prompt_tokens: int, queued_prompts: float | None, mean_prompt: float
    ) -> float:
        """From a seat to the first token of a request of `priority` here: the prompt tokens
        ahead of it (the engine's, by its stats, and `queued_prompts` prompt tokens from Redis
        of mean prompts; None: seated later, when all of those are done), then its own, in
        chunks of prefill_chunk_tokens; every chunk's turn costs prefill_step_s (the decodes
        riding it), then the turn that delivers the token."""
        if self.prefill_step_s is None:  # a worker that does not publish it: the mean price
            return prompt_tokens * self.prefill_token_s
        ahead, ahead_s = 0.0, 0.0
        if queued_prompts is not None:
            ahead = self.prefill_ahead_tokens.get(priority, 0) + queued_prompts
            ahead_s = self.prefill_ahead_s.get(priority, 0.0) + queued_prompts * (
                self.prefill_tok_s + self.prefill_pair_s * (mean_prompt + 1) / 2
            )
        own_s = prompt_tokens * self.prefill_tok_s + self.prefill_pair_s * causal_pairs(
            prompt_tokens
        )
        chunk = self.prefill_chunk_tokens
        own_turns = prompt_tokens / max(1, chunk)
        if 0 < self.prefill_hold_tokens <= prompt_tokens and self.prefill_long_chunk_tokens > 0:
            chunk = min(chunk, self.prefill_long_chunk_tokens)  # a long prompt's share a turn
            # The engine grants a long prompt its share in seconds, each chunk priced at its own
            # offset (engine/core/step_cost.py, PrefillPolicy): the published chunk is the one at
            # offset 0, and later chunks, paying attention over all before them, are smaller.
            # Its turns are its own prefill over that chunk's time.
            turn_s = chunk * self.prefill_tok_s + self.prefill_pair_s * causal_pairs(chunk)
            own_turns = own_s / turn_s if turn_s > 0 else prompt_tokens / chunk
        turns = math.ceil(ahead / max(1, chunk) + own_turns - 1e-9)
        return turns * self.prefill_step_s + ahead_s + own_s + self.decode_step_s


def causal_pairs(tokens: float) -> float:
    """Causal attention pairs of a whole prompt (engine/core/step_cost.py's chunk_pairs summed
    over its chunks, whatever the chunking)."""
    return tokens * (tokens + 1) / 2


@dataclass(frozen=True, slots=True)
class Prediction:
    ttft_s: float
    reason: str  # what holds the line when it is too long: ttft | kv
    # Of ttft_s, the request's own prefill and delivering turn on the worker forecast to serve
    # it, with nothing ahead (a long prompt's bound leaves it out: LoadShedder.bound)
    own_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Load:
    queued_tokens: dict[str, int]  # priority → tokens queued, not yet read by a worker
    tokens_per_s: float  # the live workers' service rate, summed (the unpriced fallback)
    mean_output_tokens: float | None  # expected output of a request (None: nothing measured)
    routes: tuple[str, ...] = ()  # workers with queues of their own (service/routing.py)
    mean_prompt_tokens: float | None = None
    workers: tuple[WorkerLoad, ...] = ()  # the priced live workers
    # ... of the mean prompt's tokens, those the prefix cache did not hold (None: all)
    mean_uncached_prompt_tokens: float | None = None

    def admitted(self, priority: str, tokens: int) -> Load:
        """This load with a request admitted since it was read: until the next read, the
        requests an API process admits count against the ones after them."""
        queued = dict(self.queued_tokens)
        queued[priority] = queued.get(priority, 0) + tokens
        return dataclasses.replace(self, queued_tokens=queued)

    def predict(
        self, priority: str, prompt_tokens: int, request_tokens: int | None = None
    ) -> Prediction:
        """The predicted time to first token of a request of `priority` whose prompt and
        expected output hold `request_tokens` of KV (None: the mean request's)."""
        ahead = ["interactive", "batch"] if priority == "batch" else ["interactive"]
        queued = sum(self.queued_tokens.get(prio, 0) for prio in ahead)
        if not self.workers:
            wait = queued / self.tokens_per_s if self.tokens_per_s > 0 else 0.0
            return Prediction(wait, "ttft")
        n = len(self.workers)
        prefill_s = sum(w.prefill_token_s for w in self.workers) / n
        decode_s = sum(w.decode_token_s for w in self.workers) / n
        mean_prompt = self.mean_prompt_tokens or DEFAULT_PROMPT_TOKENS
        mean_output = self.mean_output_tokens or DEFAULT_OUTPUT_TOKENS
        # A queued prompt costs only what the prefix cache will not hold (its own prompt is
        # priced whole: its hits are not known yet).
        uncached = mean_prompt
        if self.mean_uncached_prompt_tokens is not None:
            uncached = min(mean_prompt, self.mean_uncached_prompt_tokens)
        mean_work = uncached * prefill_s + mean_output * decode_s
        work = queued * mean_work / (mean_prompt + mean_output)  # Redis: the mean mix
        work += sum(w.waiting_work_s.get(prio, 0.0) for w in self.workers for prio in ahead)
        free = sum(w.startable.get(priority, 0) for w in self.workers) * mean_work
        # What it takes to start, in mean requests (`startable` counts KV in those): a request
        # holding k times the mean request's KV waits until k of them could start.
        units = max(1.0, (request_tokens or 0) / (mean_prompt + mean_output))
        wait = max(0.0, work + units * mean_work - free) / self.pace(priority)
        if priority != "batch":
            wait = max(wait, self.seat_wait(queued / (mean_prompt + mean_output)))
        full = [w for w in self.workers if w.startable.get(priority, 0) == 0]
        reason = "kv" if full and all(w.limited_by == "kv" for w in full) else "ttft"
        # Seated at once: the prompts ahead of it (the engines' and Redis's, shared among the
        # workers) are prefilled before its own. Seated later: those took the seats that freed
        # before its own and were prefilled meanwhile.
        queued_prompts = None if wait else queued * uncached / (mean_prompt + mean_output) / n
        # The engine's hold counts from the enqueue: a wait for a seat longer than it hides it.
        ttft, w = min(
            (
                (
                    max(wait, w.held_s(priority, prompt_tokens))
                    + w.first_token_s(priority, prompt_tokens, queued_prompts, mean_prompt),
                    w,
                )
                for w in self.workers
            ),
            key=lambda pair: pair[0],
        )
        own = w.first_token_s(priority, prompt_tokens, None, mean_prompt)
        return Prediction(ttft, reason, own)

    def seat_wait(self, queued_requests: float) -> float:
        """An interactive request's wait for a seat by the workers' seat schedules: it gets one
        when the (over + queued + 1)-th of their running interactive requests ends (0 when one
        is free). The rate of the work model above is right on average; this sees the order in
        which the running set will end: after a burst of admissions no seat frees for a while.
        Past the published ends, the last one (a lower bound; the work model prices the rest)."""
        if not self.workers or any(w.seat_over is None for w in self.workers):
            return 0.0
        position = sum(w.seat_over for w in self.workers) + math.ceil(queued_requests) + 1
        ends = sorted(s for w in self.workers for s in w.seat_finish_s)
        if position <= 0 or not ends:
            return 0.0
        return ends[min(position, len(ends)) - 1]

    def pace(self, priority: str) -> float:
        """Seconds of the fleet's work per second that go to work of `priority` and above: one
        per worker for interactive; for flex what interactive demand leaves (never below
        MIN_FLEX_SHARE of a worker, so a fleet taken by interactive work still forecasts a
        finite, long wait: refused with a Retry-After rather than admitted to starve)."""
        if priority != "batch":
            return float(len(self.workers))
        return sum(max(MIN_FLEX_SHARE, 1.0 - w.interactive_share) for w in self.workers)


# A flex request behind interactive demand that takes 98 % of the seats waits 50 times its work.
MIN_FLEX_SHARE = 0.02


class LoadShedder:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._load: Load | None = None
        self._read_at = 0.0
        self._lock = asyncio.Lock()

    async def load(self, redis: Redis) -> Load:
        if self._load is None or time.monotonic() - self._read_at > self.settings.load_refresh_s:
            async with self._lock:  # one reader per refresh, however many requests wait on it
                if self._load is None or (
                    time.monotonic() - self._read_at > self.settings.load_refresh_s
                ):
                    self._load = await read_load(redis)
                    self._read_at = time.monotonic()
        return self._load

    @property
    def routes(self) -> tuple[str, ...]:
        """The routed workers as of the last load read (admit() reads it first)."""
        return self._load.routes if self._load is not None else ()

    def bound(self, queued: QueuedRequest, prediction: Prediction) -> float:
        """The longest predicted first token admitted: the priority's bound on the wait, and
        for a long prompt (a document of ttft_prompt_tokens or more: no TTFT target) its own
        prefill on top. Under a step-time target the engine gives documents a share of the GPU
        beside the decodes, so a 20k-token document on a 70B takes ~15 s alone at 1 req/s:
        against the wait's bound alone it was refused at any load. The documents ahead of it
        still count in the prediction, so their queue cannot grow without bound."""
        if queued.priority == "batch":
            bound = self.settings.batch_max_queue_wait_s
        else:
            bound = self.settings.max_queue_wait_s
        if len(queued.prompt_token_ids) >= self.settings.ttft_prompt_tokens:
            bound += prediction.own_s
        return bound

    async def admit(self, redis: Redis, queued: QueuedRequest) -> Prediction:
        """Sets the request's queued tokens; raises 503 when its predicted time to first token
        is over its priority's bound."""
        load = await self.load(redis)
        queued.queued_tokens = queued_tokens(queued, load.mean_output_tokens)
        prediction = load.predict(
            queued.priority, len(queued.prompt_token_ids), queued.queued_tokens
        )
        bound = self.bound(queued, prediction)
        PREDICTED_TTFT.labels(queued.priority).observe(prediction.ttft_s)
        if prediction.ttft_s <= bound:
            if self._load is load:
                self._load = load.admitted(queued.priority, queued.queued_tokens)
            return prediction
        OVERLOAD_REFUSALS.labels(queued.priority, prediction.reason).inc()
        ttft = prediction.ttft_s
        retry_after = max(1, math.ceil(ttft - bound))
        raise APIError(
            503,
            f"The server is overloaded: a {queued.priority} request would wait about "
            f"{ttft:.0f}s for its first token (the bound is {bound:.0f}s); retry in "
            f"{retry_after}s.",
            type="server_error",
            code="overloaded",
            headers={"Retry-After": str(retry_after)},
        )


async def read_load(redis: Redis) -> Load:
    routes = sorted(await redis.smembers(p.ROUTES_SET))
    tokens = await redis.eval(*queued_tokens_call(routes))
    workers = await live_workers(redis)
    rates: list[float] = []
    outputs: list[float] = []
    prompts: list[float] = []
    uncached: list[float] = []
    priced: list[WorkerLoad] = []
    if workers:
        pipe = redis.pipeline(transaction=False)
        for w in workers:
            pipe.hmget(p.stats_key(w), STATS_FIELDS)
        for values in await pipe.execute():
            stats = dict(zip(STATS_FIELDS, values))
            if stats["tokens_per_s"] is not None:
                rates.append(float(stats["tokens_per_s"]))
            if stats["mean_output_tokens"] is not None:
                outputs.append(float(stats["mean_output_tokens"]))
            if stats["mean_prompt_tokens"] is not None:
                prompts.append(float(stats["mean_prompt_tokens"]))
            if stats["mean_uncached_prompt_tokens"] is not None:
                uncached.append(float(stats["mean_uncached_prompt_tokens"]))
            if stats["prefill_token_s"] is not None and stats["decode_token_s"] is not None:
                priced.append(_worker_load(stats))
    return Load(
        queued_tokens={prio: int(t) for prio, t in zip(p.PRIORITIES, tokens)},
        tokens_per_s=sum(rates),
        mean_output_tokens=sum(outputs) / len(outputs) if outputs else None,
        routes=tuple(routes),
        mean_prompt_tokens=sum(prompts) / len(prompts) if prompts else None,
        mean_uncached_prompt_tokens=sum(uncached) / len(uncached) if uncached else None,
        workers=tuple(priced),
    )


STATS_FIELDS = [
    "tokens_per_s", "mean_output_tokens", "mean_prompt_tokens", "mean_uncached_prompt_tokens",
    "prefill_token_s",
    "decode_token_s", "startable", "startable_interactive", "startable_batch", "limited_by",
    *(f"waiting_work_s_{prio}" for prio in p.PRIORITIES),
    "decode_step_s", "prefill_step_s", "prefill_chunk_tokens", "prefill_long_chunk_tokens",
    "prefill_tok_s", "prefill_pair_s",
    *(f"prefill_ahead_tokens_{prio}" for prio in p.PRIORITIES),
    *(f"prefill_ahead_s_{prio}" for prio in p.PRIORITIES),
    "prefill_hold_s", "prefill_hold_tokens", "interactive_share", "seat_finish_s", "seat_over",
]  # fmt: skip


def _worker_load(stats: dict) -> WorkerLoad:
    def number(name: str) -> float:
        value = stats.get(name)
        return float(value) if value is not None else 0.0

    return WorkerLoad(
        prefill_token_s=number("prefill_token_s"),
        decode_token_s=number("decode_token_s"),
        startable={
            "interactive": int(number("startable_interactive")),
            # (a worker that does not publish its batch room: its whole room)
            "batch": int(
                number("startable_batch" if stats.get("startable_batch") else "startable")
            ),
        },
        waiting_work_s={prio: number(f"waiting_work_s_{prio}") for prio in p.PRIORITIES},
        limited_by=stats.get("limited_by") or "waiting",
        decode_step_s=number("decode_step_s"),
        prefill_step_s=(
            number("prefill_step_s") if stats.get("prefill_step_s") is not None else None
        ),
        prefill_chunk_tokens=max(1, int(number("prefill_chunk_tokens"))),
        prefill_long_chunk_tokens=int(number("prefill_long_chunk_tokens")),
        prefill_tok_s=number("prefill_tok_s"),
        prefill_pair_s=number("prefill_pair_s"),
        prefill_ahead_tokens={
            prio: int(number(f"prefill_ahead_tokens_{prio}")) for prio in p.PRIORITIES
        },
        prefill_ahead_s={prio: number(f"prefill_ahead_s_{prio}") for prio in p.PRIORITIES},
        prefill_hold_s=number("prefill_hold_s"),
        prefill_hold_tokens=int(number("prefill_hold_tokens")),
        interactive_share=min(1.0, max(0.0, number("interactive_share"))),
        seat_finish_s=_seconds_list(stats.get("seat_finish_s")),
        seat_over=int(stats["seat_over"]) if stats.get("seat_over") is not None else None,
    )


def _seconds_list(value: str | None) -> tuple[float, ...]:
    """A worker's comma-separated seconds (seat_finish_s), ascending."""
    if not value:
        return ()
    seconds = (float(part) for part in value.split(",") if part)
    return tuple(sorted(s for s in seconds if math.isfinite(s) and s >= 0))
