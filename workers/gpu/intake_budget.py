# How many queue entries a worker may take into its engine this turn: only what the engine can
# start and still serve at the TPOT target. Everything else stays in Redis, where every worker
# can steal it and admission sees it (api/load_shedding.py), so overload shows up as refusals at
# the API, never as a running set so large that every stream crawls. Per turn, the least of:
#
#   waiting  worker_max_waiting minus the requests already in the engine's waiting queue
#   seats    the running set the TPOT target allows (the turn the step prices predict for
#            that many rows of the mean context, each row with its share of the prompts the
#            turns carry in steady state, stays within tpot_target_s; max_num_seqs until the
#            prices are fitted) minus what runs and waits. A machine whose lone stream's turn
#            is already near the target (a loaded CPU) batches until its turn is
#            LONE_TURN_FACTOR times a lone stream's instead: half its best throughput, rather
#            than one stream at a time. (The prompt share counts there too: a 70B FP8 on an
#            H200 has a ~20 ms lone turn, and a floor of decode turns alone let it run 79 at
#            once, TPOT p50 61 ms.) The mean lengths are over the last 64 finished requests:
#            with a moving average the share swung with every long document
#   kv       free KV blocks, less what the running and waiting requests still need to reach
#            their expected length and a kv_headroom share of the pool, in blocks of the mean
#            request: admission keeps headroom so that preemption stays a transient event
#
# worker_max_held (0 by default) lets it hold that many more in its waiting queue, ready for
# the next free seat.
# An interactive request that has waited in Redis past admission's bound (max_queue_wait_s) was
# promised an earlier first token than the seats now give it (the seats move with the step
# prices' refits and the running set's context, a few percent within a second): the worker takes
# such requests past the seats, up to OVERDUE_SEAT_SHARE of them more (never past max_num_seqs,
# the waiting room or the KV). Every stream's turn grows by a few percent for a while instead of
# the promise breaking; admission, which sees the running set over its seats, refuses more until
# it is back within them. An idle engine always takes one (one that does not fit the whole pool
# fails explicitly).
# Batch work is taken only with room to spare for the interactive work expected to arrive while
# it runs, which would otherwise preempt it: flex yields to interactive, but rarely by
# preemption. By Little's law interactive work holds its share of the seats the worker sustains
# on average (recent_interactive_share, over ~2 s: workers/gpu/load_report.py), so the spare is
# that mean less what it holds now, and at least one seat and one mean request's KV for the next
# arrival. The engine keeps the same spare KV free when it admits a batch request, a preempted
# one included (Scheduler.batch_kv_reserve). With interactive demand at the worker's capacity no
# flex starts: it waits in Redis, where admission forecasts its wait with the room published
# here (startable_batch, api/load_shedding.py).
# The same pass prices the engine's waiting queue per priority (prefill of what is not computed
# plus the expected output still to come), which the worker publishes for admission.
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from engine import LLMEngine
from engine.core.request import Priority
from engine.core.step_cost import chunk_pairs
from service.settings import Settings
from workers.gpu.load_report import LoadReport
from workers.gpu.seat_schedule import SeatSchedule, seat_schedule
from workers.gpu.step_prices import StepPrices

# The TPOT target is never below this many lone-stream turns. At t(B) = 2·t(1) a running set of B
# streams gets about half the throughput of an unbounded one (t(B) ≈ t(1) + B·row): on a GPU the
# target is the lower of the two (an 8B's lone turn ~5 ms, a 70B FP8's ~17 ms on an H200).
LONE_TURN_FACTOR = 2.0
# Overdue interactive requests may fill the running set up to this share past the TPOT seats.
OVERDUE_SEAT_SHARE = 0.1


@dataclass(frozen=True, slots=True)
class IntakeBudget:
    room: int  # queue entries the engine may take now
    # ... of interactive ones, which take the seats and KV of running batch requests (the
    # scheduler preempts those for them): batch work never holds interactive work back
    interactive_room: int
    # ... of batch ones: `room` less the spare kept for interactive arrivals (batch_spare), and
    # none without batch_min_free_kv of the pool free or past batch_max_waiting in the engine
    batch_room: int
    limited_by: str  # waiting | seats | kv
    max_running: int  # the running set the TPOT target allows
    seats: int  # ... and the KV pool holds (mean requests): the running set it sustains
    interactive_demand: int  # interactive requests running or waiting in the engine
    # interactive entries it may take past interactive_room, each one waited past the admission
    # bound in Redis (work_intake.py's overdue take)
    overdue_room: int = 0
    # KV blocks the engine keeps free when it admits a batch request beside running work (the
    # spare seats' mean requests): Scheduler.batch_kv_reserve
    batch_kv_reserve: int = 0
    prefill_token_s: float | None = None  # a prompt token of the mean prompt (None: unpriced)
    decode_token_s: float | None = None  # an output token, at max_running rows
    decode_step_s: float | None = None  # the running set's predicted decode turn
    # priority → seconds of work waiting in the engine (its prefill and expected output)
    waiting_work_s: dict[str, float] = field(default_factory=dict)
    oldest_waiting_s: float = 0.0  # age of the longest-waiting request in the engine
    # How a first token waits on prefill here (api/load_shedding.py): prompt chunks of at most
    # prefill_chunk_tokens a turn, each turn costing prefill_step_s (the running set's decodes
    # riding it, the fixed and eager parts) plus its tokens and attention pairs.
    prefill_step_s: float | None = None
    prefill_chunk_tokens: int = 0
    # ... and a long prompt's (prefill_hold_tokens or more): at most the long-prompt chunk cap and,
    # with a step-time target, what the target allows beside the running set's decodes
    prefill_long_chunk_tokens: int = 0
    prefill_tok_s: float = 0.0  # per prompt token
    prefill_pair_s: float = 0.0  # per causal attention pair
    # priority → prompt tokens a new request of that priority finds ahead of it in the engine
    # (running requests' unfinished prompts, the waiting ones of its priority or higher), and
    # their tokens' and pairs' seconds
    prefill_ahead_tokens: dict[str, int] = field(default_factory=dict)
    prefill_ahead_s: dict[str, float] = field(default_factory=dict)
    # With a step-time target, how long the engine spreads an interactive prompt of fewer than
    # prefill_hold_tokens toward its deadline before giving it whole steps (its TTFT guard)
    prefill_hold_s: float = 0.0
    prefill_hold_tokens: int = 0
    # When its running interactive requests end (workers/gpu/seat_schedule.py; None: unpriced)
    seats_free: SeatSchedule | None = None

    def fields(self) -> dict[str, str]:
        """For the worker's stats hash (read by api/load_shedding.py)."""
        out = {
            "startable": str(self.room),
            "startable_interactive": str(self.interactive_room),
            # what admission forecasts a flex request with: the room the worker takes it in
            "startable_batch": str(max(0, self.batch_room)),
            "limited_by": self.limited_by,
            "max_running": str(self.max_running),
            "oldest_waiting_s": f"{self.oldest_waiting_s:.3f}",
            "prefill_hold_s": f"{self.prefill_hold_s:.3f}",
            "prefill_hold_tokens": str(self.prefill_hold_tokens),
        }
        if self.prefill_token_s is not None and self.decode_token_s is not None:
            out["prefill_token_s"] = f"{self.prefill_token_s:.6g}"
            out["decode_token_s"] = f"{self.decode_token_s:.6g}"
        if self.decode_step_s is not None:
            out["decode_step_s"] = f"{self.decode_step_s:.6g}"
        for priority, seconds in self.waiting_work_s.items():
            out[f"waiting_work_s_{priority}"] = f"{seconds:.3f}"
        if self.prefill_step_s is not None:
            out["prefill_step_s"] = f"{self.prefill_step_s:.6g}"
            out["prefill_chunk_tokens"] = str(self.prefill_chunk_tokens)
            out["prefill_long_chunk_tokens"] = str(self.prefill_long_chunk_tokens)
            out["prefill_tok_s"] = f"{self.prefill_tok_s:.6g}"
            out["prefill_pair_s"] = f"{self.prefill_pair_s:.6g}"
            for priority, tokens in self.prefill_ahead_tokens.items():
                out[f"prefill_ahead_tokens_{priority}"] = str(tokens)
                out[f"prefill_ahead_s_{priority}"] = f"{self.prefill_ahead_s[priority]:.4f}"
        if self.seats_free is not None:
            out |= self.seats_free.fields()
        return out


def intake_budget(
    engine: LLMEngine, prices: StepPrices, report: LoadReport, settings: Settings
) -> IntakeBudget:
    scheduler, bm = engine.scheduler, engine.block_manager
    num_running, num_waiting = len(scheduler.running), scheduler.num_waiting
    mean_prompt = max(1.0, report.mean_prompt_tokens)
    mean_output = max(1.0, report.mean_output_tokens)
    context_per_row = mean_prompt + mean_output / 2  # a running request, half way through

    expected = math.ceil(mean_output)
    per_request = bm.num_blocks_for(math.ceil(mean_prompt) + expected)
    headroom = math.ceil(settings.kv_headroom * bm.num_blocks)
    max_running = settings.max_num_seqs
    prefill_token_s = decode_token_s = decode_step_s = None
    seats_free = None
    kv_rows = (bm.num_blocks - headroom) // per_request
    if prices.fitted:
        # The seats at the level of the last few seconds of turns (step_prices.py says why).
        lone = prices.decode_step_s(1, int(context_per_row), seats=True)
        # In steady state a running request is replaced every mean_output turns, so a turn
        # also carries rows / mean_output new prompts (what the prefix cache did not hold):
        # on a 70B their prefill slows every stream's turn about as much as the decodes do.
        uncached = int(report.mean_uncached_prompt_tokens)
        prompt_share = prices.prefill_s(uncached, seats=True) / mean_output
        target = max(settings.tpot_target_s, LONE_TURN_FACTOR * (lone + prompt_share))
        max_running = prices.max_rows(target, context_per_row, max_running, prompt_share)
        # An output token's price is a decode turn shared by the running set the engine
        # sustains: the TPOT target's, or fewer when the KV pool holds fewer mean requests.
        rows = max(1, min(max_running, kv_rows))
        decode_token_s = prices.decode_step_s(rows, int(rows * context_per_row)) / rows
        prefill_token_s = prices.prefill_s(int(mean_prompt)) / mean_prompt
        context = sum(r.num_tokens for r in scheduler.running)
        decode_step_s = prices.decode_step_s(num_running, context) if num_running else 0.0
        # A turn of the running set carries its decodes and its share of the new prompts.
        turn_s = decode_step_s + num_running * prompt_share
        seats_free = seat_schedule(engine, max_running, turn_s, report.output_lengths)
    elif report.tokens_per_s > 0:  # not fitted yet: every token at the measured mean rate
        prefill_token_s = decode_token_s = 1.0 / report.tokens_per_s

    outlook = engine.scheduler.kv_outlook(expected)
    batch = [r for r in scheduler.requests.values() if r.priority is Priority.BATCH]
    batch_held, batch_more = outlook[Priority.BATCH]
    interactive_more = outlook[Priority.INTERACTIVE][1]

    def limits_of(others: int, free_blocks: int, more: int, waiting: int) -> dict[str, int]:
        held = settings.worker_max_held  # entries it may hold beyond what it can start
        return {
            "waiting": settings.worker_max_waiting - waiting,
            "seats": max_running - others + held,
            "kv": (free_blocks - more - headroom) // per_request + held,
        }

    free = bm.num_free_blocks
    every = limits_of(num_running + num_waiting, free, interactive_more + batch_more, num_waiting)
    # Batch requests waiting in the engine (preempted ones, mostly) are admitted after every
    # interactive one: they must not fill the waiting room an interactive arrival needs, or it
    # waits in Redis behind them.
    interactive_waiting = len(scheduler.waiting[Priority.INTERACTIVE])
    interactive_running = sum(1 for r in scheduler.running if r.priority is Priority.INTERACTIVE)
    interactive = limits_of(
        num_running + num_waiting - len(batch),
        free + batch_held,
        interactive_more,
        interactive_waiting,
    )
    limited_by = min(every, key=every.__getitem__)
    room, interactive_room = max(0, every[limited_by]), max(0, min(interactive.values()))
    over_seats = min(
        settings.max_num_seqs, max_running + math.ceil(OVERDUE_SEAT_SHARE * max_running)
    )
    overdue_seats = interactive["seats"] + over_seats - max_running
    overdue = min(interactive["waiting"], interactive["kv"], overdue_seats)
    overdue_room = max(0, overdue - interactive_room)
    seats = max(1, min(max_running, kv_rows))
    interactive_demand = interactive_running + interactive_waiting
    spare = batch_spare(report.recent_interactive_share, seats, interactive_demand)
    batch_room = room - spare
    if bm.num_free_blocks < settings.batch_min_free_kv * bm.num_blocks or (
        num_waiting > settings.batch_max_waiting
    ):
        batch_room = min(batch_room, 0)
    if num_running == num_waiting == 0 and every["waiting"] > 0:
        room = interactive_room = batch_room = max(room, 1)

    now = time.time()
    work = {p.name.lower(): 0.0 for p in Priority}
    oldest = 0.0
    for priority, queue in scheduler.waiting.items():
        for r in queue:
            oldest = max(oldest, now - r.arrival_time)
            if prefill_token_s is None or decode_token_s is None:
                continue
            to_prefill = r.num_tokens - r.num_computed_tokens
            # a preempted request has made some of its output: what is left, as the seat
            # schedule prices it (workers/gpu/output_lengths.py)
            to_decode = report.output_lengths.remaining(r.num_output_tokens, r.max_tokens)
            prefill = (
                prices.prefill_s(to_prefill) if prices.fitted else to_prefill * prefill_token_s
            )
            work[priority.name.lower()] += prefill + to_decode * decode_token_s
    # New prompts a turn carries in steady state (a running request is replaced every
    # mean_output turns), the uncached part of each: what short prompts take of a turn's pool.
    new_prompt_tokens = num_running * report.mean_uncached_prompt_tokens / mean_output
    prefill = _prefill_outlook(engine, prices, new_prompt_tokens) if prices.fitted else {}
    policy = engine.prefill_policy
    if policy is not None:
        prefill |= {
            "prefill_hold_s": policy.ttft_guard_s,
            "prefill_hold_tokens": policy.ttft_prompt_tokens,
        }
    return IntakeBudget(
        room=room,
        interactive_room=interactive_room,
        batch_room=batch_room,
        limited_by=limited_by,
        max_running=max_running,
        seats=seats,
        interactive_demand=interactive_demand,
        overdue_room=overdue_room,
        batch_kv_reserve=spare * per_request,
        prefill_token_s=prefill_token_s,
        decode_token_s=decode_token_s,
        decode_step_s=decode_step_s,
        waiting_work_s=work,
        oldest_waiting_s=oldest,
        seats_free=seats_free,
        **prefill,
    )


def batch_spare(interactive_share: float, seats: int, interactive_demand: int) -> int:
    """Seats (and mean requests' KV) batch intake leaves free for interactive arrivals: what
    interactive work holds on average less what it holds now, at least one."""
    return max(1, math.ceil(interactive_share * seats - 1e-9) - interactive_demand)


def _prefill_outlook(engine: LLMEngine, prices: StepPrices, new_prompt_tokens: float) -> dict:
    """IntakeBudget's prefill fields: what a new request's first token waits for here once it
    has a seat. Running requests' prompt chunks go first in every turn (the scheduler serves
    the running set before admitting), then the waiting ones, interactive before batch.
    new_prompt_tokens: the prompt tokens the turns carry for new requests, on average."""
    scheduler = engine.scheduler
    tok_s, pair_s = prices.prefill_token_weights()

    def seconds(r) -> float:
        remaining = r.num_tokens - r.num_computed_tokens
        return remaining * tok_s + chunk_pairs(remaining, r.num_computed_tokens) * pair_s

    running = [r for r in scheduler.running if r.num_tokens - r.num_computed_tokens > 1]
    tokens = sum(r.num_tokens - r.num_computed_tokens for r in running)
    spent = sum(seconds(r) for r in running)
    ahead_tokens: dict[str, int] = {}
    ahead_s: dict[str, float] = {}
    for priority in Priority:  # serving order: interactive, then batch
        for r in scheduler.waiting[priority]:
            tokens += r.num_tokens - r.num_computed_tokens
            spent += seconds(r)
        ahead_tokens[priority.value], ahead_s[priority.value] = tokens, spent
    num_running = len(scheduler.running)
    context = sum(r.num_tokens for r in scheduler.running)
    # Decodes take one token each of the turn's budget first.
    chunk = max(1, scheduler.max_num_batched_tokens - num_running)
    long_chunk = min(chunk, scheduler.order.long_chunk or chunk)
    policy = engine.prefill_policy
    if policy is not None and policy.model.fitted and num_running:
        # A long prompt is never guarded: while decodes run it gets what the target allows or
        # its share of the GPU, the larger (PrefillPolicy.plan; on the H200 an 8B's 18-20k-token
        # documents took 1.4-1.6 s against forecasts of 0.7-0.8 s priced at whole-budget chunks).
        # What the target allows is shared: the short prompts take theirs first (on an H100 the
        # 8B's 29-30k-token documents took 2.3-5.3 s against forecasts of 1.8-2.1 s priced at
        # the whole allowance).
        share = policy.long_share_tokens(num_running, context, 0, chunk)
        allowed = share  # no target: the long prompts keep to their share (pace_long_prompts)
        if not math.isinf(policy.step_time_target_s):
            allowed = policy.model.max_prefill_tokens(
                num_running, context, 0, policy.step_time_target_s, chunk
            )
            allowed = max(int(max(0.0, allowed - new_prompt_tokens)), share)
        long_chunk = min(long_chunk, max(1, allowed))
    return {
        "prefill_step_s": prices.prefill_step_s(num_running, context),
        "prefill_chunk_tokens": chunk,
        "prefill_long_chunk_tokens": long_chunk,
        "prefill_tok_s": tok_s,
        "prefill_pair_s": pair_s,
        "prefill_ahead_tokens": ahead_tokens,
        "prefill_ahead_s": ahead_s,
    }
