# Scheduler behaviour through the real engine on the `tiny` preset (random weights, CPU).
import pytest

from engine import LLMEngine, SamplingParams
from engine.config import EngineConfig
from engine.core.scheduler import SchedulerOutput

LONG = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)


def _engine(**options) -> LLMEngine:
    options.setdefault("num_kv_blocks", 64)
    return LLMEngine(EngineConfig(model="tiny", device="cpu", **options))


def _running_ids(engine: LLMEngine) -> set[str]:
    return {r.request_id for r in engine.scheduler.running}


def _drain(engine: LLMEngine, limit: int = 10_000) -> dict:
    finished = {}
    for _ in range(limit):
        if not engine.has_unfinished():
            return finished
        for d in engine.step():
            if d.finished:
                assert d.request_id not in finished, "a request finished twice"
                finished[d.request_id] = d
    raise AssertionError("engine did not drain")


def test_interactive_is_admitted_before_batch():
    engine = _engine(max_num_seqs=1)
    engine.add_request("batch-1", list(range(10)), LONG, "batch")
    engine.add_request("chat-1", list(range(10)), LONG, "interactive")
    engine.step()
    assert _running_ids(engine) == {"chat-1"}


def test_arriving_interactive_preempts_running_batch():
    # 8 blocks × 16 tokens: two batch requests of 60 tokens hold all of them.
    engine = _engine(num_kv_blocks=8)
    engine.add_request("batch-old", list(range(60)), LONG, "batch")
    engine.add_request("batch-new", list(range(100, 160)), LONG, "batch")
    engine.step()
    assert _running_ids(engine) == {"batch-old", "batch-new"}
    engine.add_request("chat", list(range(200, 250)), LONG, "interactive")
    engine.step()
    running = _running_ids(engine)
    assert "chat" in running
    # The most recently admitted batch request is the victim.
    assert "batch-new" not in running and "batch-old" in running
    assert engine.scheduler.requests["batch-new"].num_preemptions == 1
    done = _drain(engine)
    assert {d.finish_reason for d in done.values()} == {"length"}
    assert engine.stats().num_free_blocks == 8


def test_a_batch_request_is_admitted_beside_running_work_only_with_the_reserve_free():
    # 16 blocks of 16 tokens. A chat holds 4 (60 tokens); a batch request of 60 tokens needs 4 of
    # the 12 free. The worker's reserve for interactive arrivals is 9 blocks: it waits.
    engine = _engine(num_kv_blocks=16)
    engine.scheduler.batch_kv_reserve = 9
    engine.add_request("chat", list(range(60)), LONG, "interactive")
    engine.step()
    engine.add_request("batch", list(range(100, 160)), LONG, "batch")
    engine.step()
    assert _running_ids(engine) == {"chat"}
    engine.scheduler.batch_kv_reserve = 8  # 12 free - 4 needed leaves 8: it starts
    engine.step()
    assert _running_ids(engine) == {"chat", "batch"}
    # Preempted, its blocks stay cached but free: re-admitting it costs them all the same.
    sched = engine.scheduler
    sched._preempt(sched.requests["batch"], SchedulerOutput())
    free = engine.stats().num_free_blocks
    needs = sched.block_manager.num_blocks_for(sched.requests["batch"].num_tokens + 1)
    sched.batch_kv_reserve = free - needs + 1
    engine.step()
    assert _running_ids(engine) == {"chat"}
    sched.batch_kv_reserve = free - needs
    engine.step()
    assert _running_ids(engine) == {"chat", "batch"}
    # An engine with nothing running takes a batch request whatever the reserve.
    idle = _engine(num_kv_blocks=16)
    idle.scheduler.batch_kv_reserve = 16
    idle.add_request("batch", list(range(60)), LONG, "batch")
    idle.step()
    assert _running_ids(idle) == {"batch"}
    assert {d.finish_reason for d in _drain(engine).values()} == {"length"}


def _collect(engine: LLMEngine, tokens: dict) -> dict:
    finished = {}
    while engine.has_unfinished():
        for d in engine.step():
            tokens.setdefault(d.request_id, []).extend(d.new_token_ids)
            if d.finished:
                finished[d.request_id] = d.finish_reason
    return finished


def test_arriving_interactive_takes_a_batch_seat_when_all_seats_are_full():
    # Plenty of memory, but max_num_seqs=2 seats both held by batch work.
    prompts = {"batch-old": list(range(10)), "batch-new": list(range(20, 30))}
    alone = _engine()
    for rid, prompt in prompts.items():
        alone.add_request(rid, prompt, LONG, "batch")
    expected: dict = {}
    _collect(alone, expected)
    engine = _engine(max_num_seqs=2)
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, LONG, "batch")
    tokens: dict = {}
    for d in engine.step():
        tokens.setdefault(d.request_id, []).extend(d.new_token_ids)
    assert _running_ids(engine) == {"batch-old", "batch-new"}
    engine.add_request("chat", list(range(40, 50)), LONG, "interactive")
    for d in engine.step():
        tokens.setdefault(d.request_id, []).extend(d.new_token_ids)
    assert _running_ids(engine) == {"batch-old", "chat"}  # the newest batch request yields
    assert engine.scheduler.requests["batch-new"].num_preemptions == 1
    # The recomputed request produces exactly what it would have alone.
    finished = _collect(engine, tokens)
    assert finished == {"batch-old": "length", "batch-new": "length", "chat": "length"}
    for rid in prompts:
        assert tokens[rid] == expected[rid]
    assert engine.stats().num_free_blocks == engine.stats().num_total_blocks


def test_batch_never_takes_a_seat_from_anyone():
    engine = _engine(max_num_seqs=1)
    engine.add_request("chat", list(range(10)), LONG, "interactive")
    engine.step()
    engine.add_request("batch", list(range(20, 30)), LONG, "batch")
    engine.step()
    assert _running_ids(engine) == {"chat"}
    assert engine.scheduler.requests["chat"].num_preemptions == 0


def test_victim_under_pressure_is_lowest_class_most_recent():
    engine = _engine(num_kv_blocks=9)
    engine.add_request("chat-a", list(range(40)), LONG, "interactive")
    engine.add_request("batch-a", list(range(40, 80)), LONG, "batch")
    engine.add_request("chat-b", list(range(80, 120)), LONG, "interactive")
    engine.step()
    assert _running_ids(engine) == {"chat-a", "batch-a", "chat-b"}
    # Decoding grows every request until the pool runs dry; the batch request goes first.
    while engine.stats().num_preemptions == 0:
        engine.step()
    assert engine.scheduler.requests["batch-a"].num_preemptions == 1
    assert engine.scheduler.requests["chat-a"].num_preemptions == 0
    assert engine.scheduler.requests["chat-b"].num_preemptions == 0
    _drain(engine)


def test_prompt_larger_than_pool_fails_explicitly():
    engine = _engine(num_kv_blocks=4, max_model_len=1000)
    engine.add_request("huge", list(range(100)), LONG)
    done = _drain(engine)
    assert done["huge"].finish_reason == "error"
    assert "KV blocks" in done["huge"].error and "pool holds 4" in done["huge"].error
    assert engine.stats().num_free_blocks == 4


def test_a_request_preempted_many_times_completes_with_the_undisturbed_tokens():
    # A batch request in a 6-block pool (40 + 40 tokens = 5 blocks) keeps being displaced by
    # interactive requests that arrive while it runs (each needs 4 blocks: the two never fit
    # together). Each time it resumes from its prompt and the tokens it already produced, and
    # it ends with exactly its undisturbed greedy output: preemption never fails a request.
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    short = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    prompt = list(range(40))
    expected: dict = {}
    alone = _engine(num_kv_blocks=6)
    alone.add_request("flex", prompt, params, "batch")
    _collect(alone, expected)
    engine = _engine(num_kv_blocks=6)
    engine.add_request("flex", prompt, params, "batch")
    tokens: dict = {}
    done: dict = {}
    arrivals = 0
    while "flex" not in done:
        if arrivals < 12 and "flex" in _running_ids(engine):
            engine.add_request(f"chat-{arrivals}", list(range(100, 150)), short, "interactive")
            arrivals += 1
        for d in engine.step():
            tokens.setdefault(d.request_id, []).extend(d.new_token_ids)
            if d.finished:
                done[d.request_id] = d
    _drain(engine)
    assert done["flex"].finish_reason == "length", done["flex"].error
    assert tokens["flex"] == expected["flex"]
    assert done["flex"].usage.preemptions > 8  # past the old limit that failed it
    assert engine.stats().num_free_blocks == 6


def test_abort_frees_blocks_before_the_next_forward():
    engine = _engine()
    engine.add_request("keep", list(range(30)), LONG)
    engine.add_request("drop", list(range(30, 90)), LONG)
    engine.step()
    engine.step()
    held = len(engine.scheduler.requests["drop"].block_ids)
    free_before = engine.stats().num_free_blocks
    assert engine.abort("drop")
    assert engine.stats().num_free_blocks == free_before + held
    deltas = engine.step()
    aborted = [d for d in deltas if d.request_id == "drop"]
    assert len(aborted) == 1 and aborted[0].finished and aborted[0].finish_reason == "abort"
    assert aborted[0].usage.completion_tokens == 2
    assert not engine.abort("drop")  # already gone
    _drain(engine)
    assert engine.stats().num_free_blocks == 64


def test_no_block_leaks_after_mixed_endings():
    engine = _engine(num_kv_blocks=20, max_num_batched_tokens=40)
    for i in range(12):
        params = SamplingParams(temperature=0.8, seed=i, max_tokens=5 + 7 * i, ignore_eos=True)
        engine.add_request(
            f"r{i}", list(range(i, i + 17 * (i % 5 + 1))), params, ["interactive", "batch"][i % 2]
        )
    early = {d.request_id for _ in range(5) for d in engine.step() if d.finished}
    engine.abort("r3")
    engine.abort("r8")
    done = _drain(engine)
    assert early.isdisjoint(done) and len(early) + len(done) == 12
    assert done["r3"].finish_reason == done["r8"].finish_reason == "abort"
    assert engine.stats().num_free_blocks == 20
    assert all(b.ref_count == 0 for b in engine.block_manager.blocks)


def test_context_limits_are_checked_at_admission():
    engine = _engine(max_model_len=64)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        engine.add_request("x", list(range(60)), SamplingParams(max_tokens=10))
    with pytest.raises(ValueError, match="prompt has 64 tokens"):
        engine.add_request("y", list(range(64)), SamplingParams())
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("z", [], SamplingParams())
    with pytest.raises(ValueError, match="token ids"):
        engine.add_request("w", [10_000], SamplingParams())
    engine.add_request("ok", list(range(10)), SamplingParams(max_tokens=None, ignore_eos=True))
    done = _drain(engine)
    assert done["ok"].usage.completion_tokens == 54 and done["ok"].finish_reason == "length"


def test_reset_prefix_cache_makes_a_repeated_prompt_miss():
    engine = _engine()
    prompt = list(range(40))  # two full blocks a repeat can reuse
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)

    def cached_tokens(request_id: str) -> int:
        engine.add_request(request_id, prompt, params)
        return _drain(engine)[request_id].usage.cached_tokens

    assert cached_tokens("first") == 0
    assert cached_tokens("repeat") == 32
    assert engine.reset_prefix_cache() >= 2
    assert cached_tokens("after-reset") == 0
    assert cached_tokens("repeat-again") == 32
