# What a worker may take into its engine (workers/gpu/intake_budget.py): only what the engine can
# start and still serve at the TPOT target, with KV headroom; interactive requests count the
# seats and KV of running batch requests as theirs. A real engine (tiny preset, CPU) and step
# prices fit on a synthetic machine's turns (workers/gpu/step_prices.py).
from __future__ import annotations

import random

import pytest

from engine import LLMEngine, SamplingParams
from engine.config import EngineConfig
from engine.core.step_cost import StepFeatures, chunk_pairs
from service.settings import Settings
from workers.gpu.intake_budget import batch_spare, intake_budget
from workers.gpu.load_report import FINISHED_WINDOW, RECENT_TAU_S, SHARE_TAU_S, LoadReport
from workers.gpu.step_prices import StepPrices

# A synthetic machine: 10 ms fixed per turn, 20 ms more with a prompt chunk, 5 ms per decode
# row, 1 µs per context token read, 0.1 ms per prompt token, no attention-pair cost.
TRUE = (0.010, 0.020, 0.005, 1e-6, 1e-4, 0.0)
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


def fitted_prices() -> StepPrices:
    rng = random.Random(0)
    prices = StepPrices()
    for _ in range(256):
        decodes = rng.randint(0, 40)
        chunk = rng.choice([0, 0, rng.randint(1, 512)])
        f = StepFeatures(decodes, decodes * rng.randint(10, 200), chunk, chunk_pairs(chunk, 0))
        prices.observe(f, float(f.vector() @ TRUE))
    assert prices.fitted
    return prices


def report(prompt: int = 16, output: int = 32) -> LoadReport:
    r = LoadReport()
    r.on_finished(output, prompt)
    return r


def settings(**kw) -> Settings:
    return Settings(_env_file=None, model="tiny", device="cpu", **kw)


def engine(num_kv_blocks: int = 256, max_num_seqs: int = 256, **config) -> LLMEngine:
    return LLMEngine(
        EngineConfig(model="tiny", device="cpu", num_kv_blocks=num_kv_blocks,
                     max_num_seqs=max_num_seqs, **config)
    )  # fmt: skip


def run(eng: LLMEngine, n: int, priority: str = "interactive", prefix: str = "r") -> None:
    for i in range(n):
        eng.add_request(f"{prefix}{i}", list(range(1, 17)), GREEDY, priority)
    eng.step()


def test_the_running_set_stops_at_what_the_tpot_target_allows():
    # 10 ms + (5 ms + 1 µs × 32 tokens) per row ≤ 40 ms: at most 5 rows.
    prices, eng = fitted_prices(), engine()
    budget = intake_budget(eng, prices, report(), settings(tpot_target_s=0.04))
    assert budget.max_running == 5 and budget.room == 5
    run(eng, 3)
    budget = intake_budget(eng, prices, report(), settings(tpot_target_s=0.04))
    assert budget.room == budget.interactive_room == 2 and budget.limited_by == "seats"
    assert budget.batch_room == 1  # one seat kept for an interactive arrival
    run(eng, 2, prefix="s")
    budget = intake_budget(eng, prices, report(), settings(tpot_target_s=0.04))
    assert budget.room == 0 and budget.decode_step_s <= 0.04
    # Held entries: that many more wait in the engine for the next free seat.
    held = intake_budget(eng, prices, report(), settings(tpot_target_s=0.04, worker_max_held=3))
    assert held.room == 3
    # A looser target lets the engine take more; the worker's waiting room still caps a turn.
    loose = intake_budget(eng, prices, report(), settings(tpot_target_s=0.2, worker_max_waiting=4))
    assert loose.room == 4 and loose.limited_by == "waiting"


def test_overdue_interactive_requests_may_fill_a_tenth_past_the_seats():
    # 5 seats by the TPOT target, all taken: no room, but one overdue interactive request more
    # (ceil(10 % of 5)); with it running, none.
    prices, eng = fitted_prices(), engine()
    target = settings(tpot_target_s=0.04)
    assert intake_budget(eng, prices, report(), target).overdue_room == 5 + 1 - 5  # room 5 first
    run(eng, 5)
    budget = intake_budget(eng, prices, report(), target)
    assert budget.room == budget.interactive_room == 0 and budget.overdue_room == 1
    run(eng, 1, prefix="late")
    assert intake_budget(eng, prices, report(), target).overdue_room == 0
    # Never past the engine's own max_num_seqs, nor its waiting room.
    capped = engine(max_num_seqs=5)
    run(capped, 5)
    assert (
        intake_budget(
            capped, prices, report(), settings(tpot_target_s=0.04, max_num_seqs=5)
        ).overdue_room
        == 0
    )
    # A looser target has seats to spare, yet no waiting room: nothing overdue is taken.
    no_wait = settings(tpot_target_s=0.2, worker_max_waiting=0)
    assert intake_budget(eng, prices, report(), no_wait).overdue_room == 0


def test_batch_work_leaves_the_seats_interactive_work_holds_on_average():
    # 5 seats; interactive work has held 4 of them lately (Little's law: its arrivals keep about
    # that many busy) and holds 1 now: 3 are kept for it, and batch work may take 1 of the 4 free.
    prices, eng = fitted_prices(), engine()
    load = report()
    load.on_seats(4, 5, 0.0)
    run(eng, 1)
    budget = intake_budget(eng, prices, load, settings(tpot_target_s=0.04))
    assert (budget.seats, budget.interactive_demand) == (5, 1)
    assert budget.room == budget.interactive_room == 4 and budget.batch_room == 1
    # Interactive demand at the worker's capacity: no batch work starts (it waits in Redis).
    load.on_seats(5, 5, 1000.0)
    budget = intake_budget(eng, prices, load, settings(tpot_target_s=0.04))
    assert budget.room == 4 and budget.batch_room <= 0
    # At its mean or above, one seat is still kept for the next arrival.
    assert batch_spare(0.8, 5, 4) == batch_spare(0.8, 5, 5) == batch_spare(0.0, 5, 0) == 1
    assert batch_spare(0.5, 256, 100) == 28


def test_batch_room_needs_free_kv_and_a_short_waiting_queue_and_is_published():
    prices, eng = fitted_prices(), engine(max_num_seqs=2)
    run(eng, 1)
    eng.add_request("w1", list(range(1, 17)), GREEDY)
    eng.add_request("w2", list(range(1, 17)), GREEDY)  # one running, two waiting
    loose = settings(tpot_target_s=1.0, worker_max_waiting=8)
    budget = intake_budget(eng, prices, report(), loose)
    assert budget.batch_room == budget.room - 1 > 0
    assert budget.fields()["startable_batch"] == str(budget.batch_room)
    # Less of the pool free than batch_min_free_kv, or more waiting than batch_max_waiting:
    # no batch work is taken, and admission is told so.
    for strict in (
        settings(tpot_target_s=1.0, worker_max_waiting=8, batch_min_free_kv=0.999),
        settings(tpot_target_s=1.0, worker_max_waiting=8, batch_max_waiting=0),
    ):
        budget = intake_budget(eng, prices, report(), strict)
        assert budget.room > 0 and budget.batch_room <= 0
        assert budget.fields()["startable_batch"] == "0"


def test_kv_headroom_holds_back_what_would_need_preemption():
    # 16 blocks of 16 tokens; the mean request (16 + 32 tokens) needs 3; 10 % headroom keeps 2.
    prices, eng = fitted_prices(), engine(num_kv_blocks=16)
    budget = intake_budget(eng, prices, report(), settings(tpot_target_s=1.0))
    assert budget.room == (16 - 2) // 3 and budget.limited_by == "kv"
    run(eng, 4)  # each holds 2 blocks now and will need 3: 12 committed
    budget = intake_budget(eng, prices, report(), settings(tpot_target_s=1.0))
    assert budget.room == 0 and budget.limited_by == "kv"


def test_an_idle_engine_always_takes_one():
    prices, eng = fitted_prices(), engine(num_kv_blocks=2)
    budget = intake_budget(eng, prices, report(prompt=100, output=100), settings())
    assert budget.room == budget.interactive_room == budget.batch_room == 1


def test_interactive_requests_count_running_batch_seats_and_kv_as_theirs():
    prices, eng = fitted_prices(), engine()
    run(eng, 5, "batch")
    budget = intake_budget(eng, prices, report(), settings(tpot_target_s=0.04))
    assert budget.room == budget.batch_room + 1 == 0
    assert budget.interactive_room == 5


def test_waiting_work_is_priced_per_priority():
    prices, eng = fitted_prices(), engine(max_num_seqs=1)
    run(eng, 1)
    eng.add_request("chat", list(range(1, 101)), GREEDY, "interactive")
    eng.add_request("flex", list(range(1, 201)), GREEDY, "batch")
    budget = intake_budget(eng, prices, report(), settings())
    # 100 prompt tokens (+ the eager turn) and 32 expected output tokens at the TPOT rows' price
    chat = 0.020 + 100 * 1e-4 + 32 * budget.decode_token_s
    assert abs(budget.waiting_work_s["interactive"] - chat) < 0.1 * chat
    assert budget.waiting_work_s["batch"] > budget.waiting_work_s["interactive"]
    assert budget.oldest_waiting_s >= 0.0
    fields = budget.fields()
    assert {"prefill_token_s", "decode_token_s", "startable", "startable_interactive"} <= set(
        fields
    )


def test_waiting_work_prices_the_output_capped_by_each_requests_max_tokens():
    # Finished outputs 8, 8, 8 and 200: the mean is 56, but a request capped at 64 tokens is
    # expected to make (3 * 8 + 64) / 4 = 22 (the seat schedule's remaining output).
    prices, eng = fitted_prices(), engine(max_num_seqs=1)
    load = LoadReport()
    for output in (8, 8, 8, 200):
        load.on_finished(output, 16)
    run(eng, 1)
    capped = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    eng.add_request("chat", list(range(1, 101)), capped, "interactive")
    budget = intake_budget(eng, prices, load, settings())
    expected = 0.020 + 100 * 1e-4 + 22 * budget.decode_token_s
    assert abs(budget.waiting_work_s["interactive"] - expected) < 0.05 * expected


def test_prices_follow_a_machine_that_slows_down():
    prices = fitted_prices()
    before = prices.decode_step_s(8, 8 * 32)
    f = StepFeatures(8, 8 * 32, 0, 0.0)
    for _ in range(100):  # the same turns now take twice as long (a CPU shared under load)
        prices.observe(f, 2 * float(f.vector() @ TRUE))
    assert 1.7 * before < prices.decode_step_s(8, 8 * 32) < 2.3 * before


def test_the_seats_level_is_seconds_of_turns_not_a_run_of_one_kind():
    # The H200's 8B: with its seats full the worker took nothing, its turns were all decodes,
    # which the fit under-predicted; the per-turn level rose and the seats fell 19 % in 0.7 s.
    # The seats' level counts the last few seconds: such a run moves them a few percent, while
    # a machine that stays slower is followed within seconds.
    prices = fitted_prices()
    f = StepFeatures(8, 8 * 32, 0, 0.0)
    turn = float(f.vector() @ TRUE)
    for _ in range(round(5.0 / turn)):  # five seconds of turns as predicted
        prices.observe(f, turn)
    seats = prices.max_rows(0.2, 32, 10_000)
    level = prices.scale
    for _ in range(round(0.7 / (1.2 * turn))):  # 0.7 s of them 20 % slower
        prices.observe(f, 1.2 * turn)
    assert prices.scale > level * 1.05  # the per-turn level (admission's predictions) follows
    assert prices.max_rows(0.2, 32, 10_000) >= 0.94 * seats
    for _ in range(round(10.0 / (2 * turn))):  # then ten seconds at twice the time
        prices.observe(f, 2 * turn)
    assert prices.max_rows(0.2, 32, 10_000) < 0.6 * seats


def test_a_long_prompts_chunk_is_what_the_step_target_allows_beside_the_decodes():
    # 5 decodes on the synthetic machine: 10 + 20 + 5 × 5 ms before the chunk, 0.1 ms a prompt
    # token: a 0.2 s target leaves ~1,450 tokens a turn for a long prompt, not the budget.
    prices = fitted_prices()
    eng = engine(step_time_target_s=0.2, max_num_batched_tokens=8192)
    eng.prefill_policy.model = prices.model
    run(eng, 5)
    fields = intake_budget(eng, prices, report(), settings()).fields()
    assert int(fields["prefill_chunk_tokens"]) == 8192 - 5
    assert 1300 < int(fields["prefill_long_chunk_tokens"]) < 1500
    plain = engine(max_num_batched_tokens=8192)  # no target: the long-prompt cap only
    run(plain, 5)
    fields = intake_budget(plain, prices, report(), settings()).fields()
    assert int(fields["prefill_long_chunk_tokens"]) == plain.scheduler.order.long_chunk


def test_a_long_prompts_chunk_leaves_the_short_prompts_their_part_of_the_allowance():
    # In steady state each turn carries running / mean output new prompts: 5 × 900 uncached
    # tokens / 10 outputs = 450 of the ~1,450 the target allows go to them first; never less
    # than the documents' share of the GPU.
    prices = fitted_prices()
    eng = engine(step_time_target_s=0.2, max_num_batched_tokens=8192)
    eng.prefill_policy.model = prices.model
    run(eng, 5)
    alone = int(
        intake_budget(eng, prices, report(), settings()).fields()["prefill_long_chunk_tokens"]
    )
    busy = LoadReport()
    busy.on_finished(10, 1000, cached_tokens=100)
    fields = intake_budget(eng, prices, busy, settings()).fields()
    assert int(fields["prefill_long_chunk_tokens"]) == pytest.approx(alone - 450, abs=5)
    busier = LoadReport()
    busier.on_finished(1, 100_000)
    fields = intake_budget(eng, prices, busier, settings()).fields()
    policy, context = eng.prefill_policy, sum(r.num_tokens for r in eng.scheduler.running)
    share = policy.long_share_tokens(5, context, 0, 8192 - 5)
    assert int(fields["prefill_long_chunk_tokens"]) == share


def test_batch_requests_waiting_in_the_engine_leave_the_waiting_room_to_interactive():
    # The engine's one seat is taken by an interactive request; four batch requests wait for
    # it in the engine (preempted ones do). They fill the whole waiting room for batch, none
    # of it for interactive: its arrivals are admitted before them (and take their seats), so
    # they wait in the engine, not in Redis behind the batch ones.
    prices, eng = fitted_prices(), engine(max_num_seqs=1)
    run(eng, 1)
    for i in range(4):
        eng.add_request(f"b{i}", list(range(1, 17)), GREEDY, "batch")
    budget = intake_budget(eng, prices, report(), settings(worker_max_waiting=4))
    assert budget.room == 0 and budget.limited_by == "waiting"
    # The TPOT target's 5 seats, less the running interactive request.
    assert budget.interactive_room == 4


def test_the_prefill_ahead_is_priced_as_the_engine_schedules_it():
    # Two running requests (one decoding, one with 84 of its 100 prompt tokens to go), an
    # interactive request of 100 tokens and a batch one of 200 waiting.
    prices, eng = fitted_prices(), engine()
    run(eng, 1)
    eng.add_request("long", list(range(200, 300)), GREEDY, "interactive")  # no cache hit
    eng.scheduler.max_num_batched_tokens = 17  # 1 decode + a 16-token chunk
    eng.step()
    eng.add_request("chat", list(range(1, 101)), GREEDY, "interactive")
    eng.add_request("flex", list(range(1, 201)), GREEDY, "batch")
    budget = intake_budget(eng, prices, report(), settings())
    running = eng.scheduler.running
    assert len(running) == 2 and running[1].num_computed_tokens == 16
    # A prompt-carrying turn beside the two running rows: 10 ms fixed + 20 ms eager + 5 ms a
    # row + 1 µs per context token; its chunk: the 17-token budget less the two decode rows.
    context = sum(r.num_tokens for r in running)
    assert abs(budget.prefill_step_s - (0.030 + 2 * 0.005 + context * 1e-6)) < 2e-3
    assert budget.prefill_chunk_tokens == 15
    assert abs(budget.prefill_tok_s - 1e-4) < 1e-5 and budget.prefill_pair_s < 1e-7
    assert budget.prefill_ahead_tokens == {"interactive": 84 + 100, "batch": 84 + 100 + 200}
    assert abs(budget.prefill_ahead_s["batch"] - 384 * 1e-4) < 4e-3
    fields = budget.fields()
    assert fields["prefill_ahead_tokens_interactive"] == "184"
    assert {"prefill_step_s", "prefill_chunk_tokens", "prefill_ahead_s_batch"} <= set(fields)


def test_the_mean_prompt_is_reported_less_what_the_prefix_cache_held():
    # Admission prices a queued prompt by it (api/load_shedding.py).
    report = LoadReport()
    report.on_finished(32, 1600, cached_tokens=1584)
    assert report.mean_uncached_prompt_tokens == 16 and report.mean_prompt_tokens == 1600
    report.on_finished(32, 1600)
    assert report.mean_uncached_prompt_tokens == (1600 + 16) / 2
    assert report.fields()["mean_uncached_prompt_tokens"] == "808.0"


def test_one_long_document_moves_the_means_by_its_share_of_the_window():
    report = LoadReport()
    for _ in range(FINISHED_WINDOW):
        report.on_finished(400, 2000, cached_tokens=1200)
    report.on_finished(400, 30_000)
    assert report.mean_uncached_prompt_tokens == 800 + (30_000 - 800) / FINISHED_WINDOW
    for _ in range(FINISHED_WINDOW):
        report.on_finished(400, 2000, cached_tokens=1200)
    assert report.mean_uncached_prompt_tokens == 800 and report.mean_output_tokens == 400


def test_the_seats_count_each_rows_share_of_the_prompts_the_turns_carry():
    # Every running request is replaced every mean output (32 turns here), so each turn also
    # carries rows / 32 new prompts. At 16 uncached tokens a prompt costs 20 ms + 1.6 ms: 0.675
    # ms a row and turn, and 10 ms + (5.03 + 0.675) ms per row <= 40 ms still allows 5 rows.
    prices, eng = fitted_prices(), engine()
    short = intake_budget(eng, prices, report(prompt=16), settings(tpot_target_s=0.04))
    assert short.max_running == 5
    # At 800 uncached tokens a prompt costs 100 ms: 3.1 ms a row and turn. Decode turns alone
    # (5.82 ms a row at 816 tokens of context) would allow 5 rows; with the prompts, 3.
    long = intake_budget(eng, prices, report(prompt=800), settings(tpot_target_s=0.04))
    assert long.max_running == 3
    # A machine whose lone turn with its prompt share (18.9 ms) is past half the target batches
    # until its turn is twice that instead: (37.9 ms - 10 ms) / 8.94 ms = 3 rows at a 20 ms
    # target, not the 1 the target alone would allow.
    floor = intake_budget(eng, prices, report(prompt=800), settings(tpot_target_s=0.02))
    assert floor.max_running == 3
    # ... and it counts the prompts too: with long prompts its running set is smaller than
    # decode turns alone would make it, (2 × 15.8 ms - 10 ms) / 5.82 ms = 3 rows.
    bigger = intake_budget(eng, prices, report(prompt=800, output=8), settings(tpot_target_s=0.02))
    assert bigger.max_running == 2


def test_every_published_stat_reads_back_typed_on_the_internal_route():
    # GET /internal/workers types each field by name: a new float field it does not list
    # would fail the whole route (int("0.300")).
    from api.routes.internal import _typed

    eng = engine(step_time_target_s=0.035, prefill_ttft_guard_s=0.3)  # a float, not 0
    run(eng, 2)
    budget = intake_budget(eng, fitted_prices(), report(), settings())
    fields = budget.fields() | report().fields()
    assert {"prefill_hold_s", "prefill_step_s", "mean_uncached_prompt_tokens"} <= set(fields)
    assert _typed(fields)["prefill_hold_s"] == 0.3


def test_interactive_demand_is_reported_as_a_share_of_the_seats_averaged_over_time():
    # Admission gives flex only what interactive demand leaves (api/load_shedding.py).
    report = LoadReport()
    report.on_seats(interactive=30, seats=60, now=100.0)
    assert report.interactive_share == 0.5
    # One turn later barely moves it; a time constant later it has gone most of the way.
    report.on_seats(interactive=60, seats=60, now=100.05)
    assert 0.5 < report.interactive_share < 0.51
    # A burst: within a second the recent share has moved, and admission's flex pace with it.
    report.on_seats(interactive=60, seats=60, now=101.0)
    assert report.interactive_share < 0.6 < report.recent_interactive_share
    assert report.fields()["interactive_share"] == f"{report.recent_interactive_share:.4f}"
    report.on_seats(interactive=90, seats=60, now=100.05 + 3 * SHARE_TAU_S)
    assert report.interactive_share > 0.97  # (more waiting than seats counts as all of them)
    assert report.fields()["interactive_share"] == "1.0000"  # the recent share, the larger
    # The recent share (batch intake's spare seats) follows within seconds, not tens of them.
    report.on_seats(interactive=0, seats=60, now=100.05 + 3 * SHARE_TAU_S + 2 * RECENT_TAU_S)
    assert report.recent_interactive_share < 0.15 < 0.5 < report.interactive_share
    # ... while flex's pace keeps the 10 s share until that one falls too
    assert report.fields()["interactive_share"] == f"{report.interactive_share:.4f}"


def test_the_budget_counts_interactive_demand_and_the_seats_it_is_a_share_of():
    eng = engine()
    run(eng, 2, prefix="i")  # two running
    eng.add_request("w", list(range(1, 17)), GREEDY)  # one waiting
    run(eng, 1, "batch", prefix="b")
    budget = intake_budget(eng, fitted_prices(), report(prompt=16), settings(tpot_target_s=0.04))
    assert budget.interactive_demand == 3 and budget.seats == budget.max_running == 5
