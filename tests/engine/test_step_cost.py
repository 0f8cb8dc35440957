# The latency-aware prefill budget (engine/core/step_cost.py): the online cost model recovers a
# synthetic step-time function, the allowance keeps the predicted step under the target, and
# the scheduler chunks prompts by it while decodes run — except for a short interactive prompt
# that has waited too long, which gets the whole step.
import math
import random
import time

import pytest

from engine import LLMEngine, SamplingParams
from engine.config import EngineConfig
from engine.core import step_cost
from engine.core.step_cost import PrefillPolicy, StepCostModel, StepFeatures, chunk_pairs

# A synthetic machine: 4 ms fixed, 20 ms more for an eager (prefill) step, 30 µs per decode
# row, 2 ns per context token read, 12 µs per prefill token, 1 ns per attention pair.
TRUE = (0.004, 0.020, 30e-6, 2e-9, 12e-6, 1e-9)


def true_time(f: StepFeatures) -> float:
    return float(f.vector() @ TRUE)


def random_features(rng: random.Random) -> StepFeatures:
    decodes = rng.randint(0, 200)
    chunk = rng.choice([0, 0, rng.randint(1, 8192)])
    computed = rng.randint(0, 20000)
    return StepFeatures(
        decodes,
        decodes * rng.randint(100, 4000),
        chunk,
        chunk_pairs(chunk, computed) if chunk else 0,
    )


def fitted_model(noise: float = 0.02, samples: int = 512) -> StepCostModel:
    rng = random.Random(0)
    model = StepCostModel(window=1024, min_samples=64, refit_every=32)
    for _ in range(samples):
        f = random_features(rng)
        model.observe(f, true_time(f) * (1 + rng.uniform(-noise, noise)))
    return model


def test_the_model_recovers_the_step_time_function():
    model = fitted_model()
    assert model.fitted
    rng = random.Random(1)
    for _ in range(200):
        f = random_features(rng)
        assert model.predict(f) == pytest.approx(true_time(f), rel=0.08, abs=0.0005)
    assert all(w >= 0 for w in model.weights)
    with pytest.raises(RuntimeError):
        StepCostModel().predict(StepFeatures(1, 1, 0, 0))


def test_the_allowance_keeps_the_predicted_step_under_the_target():
    model = fitted_model()
    target = 0.040
    for decodes, context, computed in [
        (10, 20_000, 0),
        (64, 150_000, 1200),
        (200, 600_000, 25_000),
    ]:
        p = model.max_prefill_tokens(decodes, context, computed, target, limit=8192)
        assert 0 < p < 8192
        at = StepFeatures(decodes, context, p, chunk_pairs(p, computed))
        over = StepFeatures(decodes, context, p + 1, chunk_pairs(p + 1, computed))
        assert model.predict(at) <= target < model.predict(over)
    # A target the decodes alone already exceed leaves no prefill; a loose one, the limit.
    assert model.max_prefill_tokens(250, 4_000_000, 0, 0.010, limit=8192) == 0
    assert model.max_prefill_tokens(1, 100, 0, 10.0, limit=8192) == 8192


def _engine(target: float | None, **options) -> LLMEngine:
    options.setdefault("num_kv_blocks", 512)
    options.setdefault("calibrate_step_costs", False)  # the tests bring their own model
    return LLMEngine(EngineConfig(model="tiny", device="cpu", step_time_target_s=target, **options))


def test_the_scheduler_chunks_prompts_by_the_allowance_while_decodes_run():
    engine = _engine(0.040, max_num_batched_tokens=4096, max_model_len=8192)
    policy = engine.prefill_policy
    policy.model = fitted_model()
    policy.observe = lambda features, seconds: None  # keep the synthetic machine's model
    decode = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
    for i in range(8):
        engine.add_request(f"chat-{i}", list(range(1, 20)), decode, arrival_time=time.time())
    engine.step()  # their prefills: no decodes running yet, the whole budget
    # A document (no TTFT deadline, so how slowly this machine runs the steps cannot matter):
    # its share and the pool, both under the target here.
    engine.add_request("doc", [7] * 5000, decode, "batch", arrival_time=time.time())
    chunks = []
    while engine.scheduler.requests["doc"].num_computed_tokens < 5000:
        engine.step()
        out_features = engine.scheduler.last_features
        chunks.append(out_features.prefill_tokens)
        assert out_features.decodes == 8
        assert policy.model.predict(out_features) <= 0.040 + 1e-9
    assert len(chunks) > 1 and max(chunks) < 4096  # chunked, not whole-budget steps


def _eight_decoding(**options) -> tuple[LLMEngine, SamplingParams]:
    """An engine with a 40 ms target on the synthetic machine's model, 8 chats decoding."""
    engine = _engine(0.040, **options)
    engine.prefill_policy.model = fitted_model()
    engine.prefill_policy.observe = lambda features, seconds: None
    decode = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    for i in range(8):
        engine.add_request(f"chat-{i}", list(range(1, 20)), decode)
    engine.step()
    return engine, decode


def test_a_short_interactive_prompt_that_waited_gets_the_whole_step():
    engine, decode = _eight_decoding(max_num_batched_tokens=4096)
    # Arrived 1 s ago (past the 0.3 s guard), 3,000 tokens (under 4,000): one step takes it.
    engine.add_request("late", list(range(500, 3500)), decode, arrival_time=time.time() - 1.0)
    engine.step()
    assert engine.scheduler.last_features.prefill_tokens == 3000


def test_a_guarded_prompt_takes_the_whole_step_for_itself_alone():
    # A 12k-token document is mid-prefill when a short prompt passes its guard: the short one
    # goes through whole, the document keeps to its allowance (on a 70B a document's chunk
    # riding the guard's whole budget made the step 0.6 s for every stream).
    engine, decode = _eight_decoding(
        max_num_batched_tokens=8192, max_model_len=16384, num_kv_blocks=2048
    )
    engine.add_request("doc", [7] * 12000, decode)
    engine.step()
    running = {r.request_id: r for r in engine.scheduler.running}
    first_chunk = running["doc"].num_computed_tokens
    assert 0 < first_chunk < 2000
    engine.add_request("late", list(range(500, 1100)), decode, arrival_time=time.time() - 1.0)
    engine.step()
    running = {r.request_id: r for r in engine.scheduler.running}
    assert running["late"].num_computed_tokens == 600
    assert running["doc"].num_computed_tokens - first_chunk <= first_chunk


def test_without_a_target_or_a_fit_nothing_changes():
    decode = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    results = []
    for target in (None, 0.040):  # 0.040 but not yet fitted: the whole budget, same tokens
        engine = _engine(target)
        engine.add_request("a", list(range(1, 40)), decode)
        tokens = []
        while engine.has_unfinished():
            tokens += [t for d in engine.step() for t in d.new_token_ids]
        results.append(tokens)
    assert results[0] == results[1]
    policy = PrefillPolicy(0.04, ttft_guard_s=0.3, ttft_prompt_tokens=4000)
    plan = policy.plan([], [], 8192, time.time())
    assert (plan.pool, plan.grants) == (8192, {})


class _Req:
    def __init__(
        self, prompt: int, computed: int = 0, age_s: float = 0.0, batch: bool = False, output=0
    ):
        from engine.core.request import Priority

        self.priority = Priority.BATCH if batch else Priority.INTERACTIVE
        self.num_prompt_tokens = prompt
        self.num_computed_tokens = computed
        self.num_tokens = prompt + output  # output > 0: resumed after a preemption
        self.arrival_time = time.time() - age_s


def test_a_target_the_decodes_already_exceed_still_moves_prompts_by_their_deadlines():
    # Why step_time_target_s made the 70B worse: its decode step alone took about the target,
    # so the target's allowance was 0 and prompts crept at 1 token a step until the TTFT guard
    # handed one the whole budget. The deadline term spreads each prompt over its steps left.
    model = fitted_model()
    decodes = [_Req(2000) for _ in range(200)]  # 200 rows x 2,000 context: ~28 ms of decode
    decode_s = model.predict(StepFeatures(200, 400_000, 0, 0.0))
    target = decode_s * 0.9
    assert model.max_prefill_tokens(200, 400_000, 0, target, limit=8192) == 0
    policy = PrefillPolicy(target, ttft_guard_s=0.3, ttft_prompt_tokens=4000, model=model)
    now = time.time()
    fresh = _Req(2000)  # just arrived: its 2,000 tokens over ~0.8 s of steps
    plan = policy.plan(decodes, [fresh], 8192, now)
    assert plan.pool == 0
    steps_left = (fresh.arrival_time + 0.8 - now) / decode_s
    assert plan.cap(fresh) == pytest.approx(2000 / steps_left, rel=0.05)
    assert 1 < plan.cap(fresh) < 2000
    # Past its deadline (but not waited past the guard: a batch prompt), all that is left.
    late = _Req(3000, computed=1000, age_s=30.0, batch=True)
    assert policy.plan(decodes, [late], 8192, now).cap(late) == 2000


def test_the_deadline_share_never_lowers_what_the_target_allows():
    model = fitted_model()
    policy = PrefillPolicy(0.040, ttft_guard_s=0.3, ttft_prompt_tokens=4000, model=model)
    decodes = [_Req(1000) for _ in range(8)]
    allowed = model.max_prefill_tokens(8, 8000, 0, 0.040, limit=8192 - 8)
    short = _Req(100)
    plan = policy.plan(decodes, [short], 8192, time.time())
    assert plan.pool_tokens(0) == allowed and plan.cap(short) == allowed


def test_the_pool_is_time_priced_at_each_prompts_own_offset():
    # Counted in tokens at the first prompt's offset, the pool let a document's chunk after a
    # long prefix (its attention over all of it) run the step past the target: on an H100 the
    # 8B's mixed steps took 46 ms at the median against a 30 ms target.
    model = fitted_model()
    policy = PrefillPolicy(0.040, ttft_guard_s=10.0, ttft_prompt_tokens=4000, model=model)
    decodes = [_Req(1000) for _ in range(8)]
    short, doc = _Req(100, batch=True), _Req(30_000, computed=20_000, batch=True)
    plan = policy.plan(decodes, [short, doc], 8192, time.time())
    fresh, deep = plan.pool_tokens(0), plan.pool_tokens(20_000)
    assert fresh == model.max_prefill_tokens(8, 8000, 0, 0.040, 8192) and 0 < deep < fresh
    # What a chunk takes is its own price: the document's step stays within the target.
    plan.take(doc, deep)
    doc_step = model.predict(StepFeatures(8, 8000, deep, chunk_pairs(deep, 20_000)))
    assert doc_step <= 0.040 + 1e-9 and plan.pool_tokens(0) <= 1
    plan.give_back(doc)
    assert plan.pool_tokens(0) == fresh
    # A short chunk leaves the rest of the pool's time, not of its tokens.
    plan.take(short, 100)
    assert plan.pool_tokens(20_000) < deep and fresh - 100 <= plan.pool_tokens(0) < fresh


def test_documents_take_their_share_of_the_gpu_oldest_first():
    # Long prompts (no TTFT target) get long_prompt_share of the step's time beside the
    # decodes, whatever their length and number: the oldest one; the others a token a step.
    model = fitted_model()
    decodes = [_Req(2000) for _ in range(200)]
    decode_s = model.predict(StepFeatures(200, 400_000, 0, 0.0))
    policy = PrefillPolicy(
        decode_s * 0.9, ttft_guard_s=0.3, ttft_prompt_tokens=4000, long_prompt_share=0.25,
        model=model,
    )  # fmt: skip
    old, new = _Req(30_000, computed=5_000, age_s=5.0), _Req(20_000, age_s=1.0)
    plan = policy.plan(decodes, [new, old], 8192, time.time())
    assert plan.pool == 0 and plan.cap(new) == 1
    tokens = plan.cap(old)
    with_doc = model.predict(StepFeatures(200, 400_000, tokens, chunk_pairs(tokens, 5_000)))
    eager_s = model.weights[1]  # a step with any chunk pays it: not the document's share
    assert with_doc - eager_s - decode_s == pytest.approx(decode_s / 3, rel=0.05)  # 25 %
    # A later share for a document that waited longer does not grow: time, not a deadline.
    older = _Req(30_000, computed=5_000, age_s=60.0)
    assert policy.plan(decodes, [older], 8192, time.time()).cap(older) == tokens


def test_paced_documents_without_a_target_keep_to_their_share_while_short_prompts_go_whole():
    # pace_long_prompts: no step target, so a short prompt takes the whole budget beside the
    # decodes (no deadline spreading; on an H100 that cost the 8B 11 % more prompt time), while
    # a document gets only its share of the step (a 70B's takes ~10 s of the GPU in whole steps).
    engine = _engine(None, pace_long_prompts=True, max_num_batched_tokens=8192,
                     max_model_len=16384, num_kv_blocks=2048)  # fmt: skip
    policy = engine.prefill_policy
    assert policy is not None and math.isinf(policy.step_time_target_s)
    policy.model = fitted_model()
    policy.observe = lambda features, seconds: None
    decode = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    for i in range(8):
        engine.add_request(f"chat-{i}", list(range(1, 20)), decode)
    engine.step()
    engine.add_request("doc", [7] * 12000, decode, "batch")
    engine.step()
    features = engine.scheduler.last_features
    share = policy.long_share_tokens(8, features.decode_context, 0, 8192 - 8)
    assert 1 < features.prefill_tokens == share < 2048
    decode_s = policy.model.predict(StepFeatures(8, features.decode_context, 0, 0.0))
    doc_s = policy.model.predict(features) - decode_s - policy.model.weights[1]
    assert doc_s == pytest.approx(decode_s / 3, rel=0.05)  # a quarter of the step
    # A short prompt beside it goes through whole; the document keeps to its share.
    done = engine.scheduler.requests["doc"].num_computed_tokens
    engine.add_request("chat", list(range(500, 3500)), decode, arrival_time=time.time())
    engine.step()
    assert engine.scheduler.requests["chat"].num_computed_tokens == 3000
    assert engine.scheduler.requests["doc"].num_computed_tokens - done <= 2 * share
    # With nothing decoding a document takes whole budgets, as without the policy.
    alone = _engine(None, pace_long_prompts=True, max_num_batched_tokens=4096,
                    max_model_len=16384, num_kv_blocks=2048)  # fmt: skip
    alone.prefill_policy.model = fitted_model()
    alone.add_request("doc", [7] * 12000, decode, "batch")
    alone.step()
    assert alone.scheduler.last_features.prefill_tokens == 4096


def test_a_resumed_request_is_long_by_its_whole_recompute_for_the_order_and_the_policy():
    # One definition of a long prompt: a 3k-token prompt preempted after 2k outputs recomputes
    # 5k tokens; the prefill order caps its chunks as a document's, so the policy paces it as one
    # (not "late by its deadline" and so all 5k in one step beside the decodes).
    from engine.core.prefill_order import PrefillOrder

    model = fitted_model()
    policy = PrefillPolicy(0.040, ttft_guard_s=0.3, ttft_prompt_tokens=4000, model=model)
    order = PrefillOrder(8192, 256, long_prompt_tokens=4000)
    resumed, fresh = _Req(3000, age_s=30.0, output=2000), _Req(3000, age_s=30.0, batch=True)
    assert order.is_long(resumed) and policy.is_long(resumed)
    assert not order.is_long(fresh) and not policy.is_long(fresh)
    decodes = [_Req(2000) for _ in range(200)]
    plan = policy.plan(decodes, [resumed, fresh], 8192, time.time())
    assert plan.cap(fresh) == 3000  # late: all that is left
    assert plan.grants[resumed] == policy.long_share_tokens(200, 400_000, 0, 8192 - 200)
    assert plan.cap(resumed) == max(plan.grants[resumed], plan.pool_tokens(0)) < 5000


def test_a_running_document_leaves_a_waiting_prompt_its_share():
    # Running prompts are served before waiting ones are admitted: a deadline share pooled over
    # both went to the document first and a short batch prompt behind it waited (simulated on
    # the 70B: seconds). Each prompt's grant is its own.
    engine, decode = _eight_decoding(
        max_num_batched_tokens=8192, max_model_len=16384, num_kv_blocks=2048
    )
    policy = engine.prefill_policy
    policy.step_time_target_s = 0.001  # the decodes alone pass it: no pool, grants only
    engine.add_request("doc", [7] * 12000, decode, "batch")
    engine.step()
    engine.add_request("chat", list(range(500, 2500)), decode, "batch", arrival_time=time.time())
    engine.step()
    running = {r.request_id: r for r in engine.scheduler.running}
    assert "chat" in running
    f = engine.scheduler.last_features
    decode_s = policy.model.predict(StepFeatures(f.decodes, f.decode_context, 0, 0.0))
    assert running["chat"].num_computed_tokens >= 0.9 * 2000 * decode_s / 0.8


def _seats_over_refits(monkeypatch, prior_steps: int) -> list[int]:
    """The TPOT rule's seats (workers/gpu/step_prices.py's formula) after each refit of a model
    fit on varied turns and then fed a running set pinned at its 256 seats, with jittery
    turns (host noise of ±25 %) and the occasional prompt chunk."""
    import engine.core.step_cost as step_cost

    monkeypatch.setattr(step_cost, "PRIOR_STEPS", prior_steps)
    rng = random.Random(5)
    model = StepCostModel(window=1024, min_samples=32, refit_every=16)
    for _ in range(256):  # the ramp up: rows of every count
        f = random_features(rng)
        model.observe(f, true_time(f) * (1 + rng.uniform(-0.05, 0.05)))
    seats = []
    for i in range(3000):
        rows = rng.randint(250, 256)
        chunk = rng.choice([0, 0, 0, rng.randint(1, 512)])
        f = StepFeatures(rows, rows * rng.randint(1800, 2600), chunk, chunk_pairs(chunk, 1200))
        model.observe(f, true_time(f) * (1 + rng.uniform(-0.25, 0.25)))
        if i % 16 == 15:
            w = model.weights
            seats.append(int((0.006 - w[0]) / (w[2] + w[3] * 2200)))
    return seats


def test_refits_of_a_pinned_running_set_keep_the_split_between_fixed_and_row_cost(monkeypatch):
    # True seats: (6 ms - 4 ms) / (30 µs + 2 ns × 2,200) = 58. Without the anchor each refit
    # splits the (collinear) fixed and row costs anew and the seats swing; with it they hold.
    truth = int((0.006 - TRUE[0]) / (TRUE[2] + TRUE[3] * 2200))
    anchored = _seats_over_refits(monkeypatch, prior_steps=step_cost.PRIOR_STEPS)
    spread = (min(anchored), max(anchored))
    assert 0.8 * truth <= spread[0] and spread[1] <= 1.2 * truth, spread
    free = _seats_over_refits(monkeypatch, prior_steps=0)
    assert max(free) - min(free) > 2 * (max(anchored) - min(anchored)), (min(free), max(free))


def test_calibration_prices_what_the_served_steps_never_show():
    # Served steps that always carry the same chunk shape (here 300 tokens after a 1,200-token
    # cached prompt) cannot tell its tokens, its attention pairs and the eager cost apart: a
    # document's 1,024-token chunk after 16k cached tokens is then priced anywhere. The
    # start-up calibration's shapes (engine/runner/step_calibration.py) pin each direction.
    from engine.core.calibration_shapes import calibration_shapes, shape_features

    rng = random.Random(1)
    online = []
    for _ in range(2048):
        decodes = rng.randint(1, 64)
        chunk = 300 if rng.random() < 0.2 else 0
        f = StepFeatures(decodes, decodes * rng.randint(500, 3000), chunk,
                         chunk_pairs(chunk, 1200) if chunk else 0.0)  # fmt: skip
        online.append((f, true_time(f) * (1 + rng.uniform(-0.02, 0.02))))
    doc = StepFeatures(16, 16 * 2048, 1024, chunk_pairs(1024, 16_384))

    def doc_error(calibrated: bool) -> float:
        model = StepCostModel()
        if calibrated:
            shapes = calibration_shapes(4096, 32_768, 256)
            model.calibrate([(shape_features(*s), true_time(shape_features(*s))) for s in shapes])
        for f, seconds in online:
            model.observe(f, seconds)
        return abs(model.predict(doc) / true_time(doc) - 1)

    assert doc_error(calibrated=True) < 0.05
    assert doc_error(calibrated=False) > 0.2


def test_an_engine_with_a_target_starts_calibrated():
    engine = _engine(0.040, calibrate_step_costs=True, max_model_len=4096)
    report = engine.calibration_report
    assert engine.prefill_policy.model.fitted and report["steps"] >= 10
    assert engine.prefill_policy.model.predict(StepFeatures(16, 16 * 2048, 0, 0.0)) > 0
    assert _engine(None, calibrate_step_costs=True).calibration_report is None  # no target


def test_small_limits_shrink_the_calibration_shapes_and_still_fit():
    # A 1k-context engine with a 256-token step (the GPU tests' model) kept one decode context
    # when shapes were filtered, not shrunk: rows and context moved together and calibrate()
    # refused (an H100 run, 2026-12-05). Shrunk, every feature still varies on its own.
    from engine.core.calibration_shapes import calibration_shapes, shape_features

    shapes = calibration_shapes(256, 1024, 256)
    assert len({c for n, c, chunks in shapes if not chunks}) == 3
    assert all(n + sum(q for q, _ in ch) <= 256 and c <= 1024 for n, c, ch in shapes)
    model = StepCostModel()
    model.calibrate([(shape_features(*s), true_time(shape_features(*s))) for s in shapes])
    probe = StepFeatures(32, 32 * 512, 100, chunk_pairs(100, 300))
    assert model.predict(probe) == pytest.approx(true_time(probe), rel=0.05)
    assert calibration_shapes(4096, 32_768, 256) == calibration_shapes(4096, 131_072, 256)
    tiny = calibration_shapes(8, 1024, 4)  # a step smaller than MIXED_ROWS: no negative prefix
    assert tiny and all(q >= 1 and p >= 0 for _, _, ch in tiny for q, p in ch)
    engine = _engine(100.0, calibrate_step_costs=True, max_model_len=1024,
                     max_num_batched_tokens=256)  # fmt: skip
    assert "error" not in engine.calibration_report and engine.prefill_policy.model.fitted


def test_a_calibration_that_fails_leaves_the_engine_fitting_online(monkeypatch):
    import engine.llm_engine as llm_engine

    def broken(runner, model):
        raise RuntimeError("no device time")

    monkeypatch.setattr(llm_engine, "calibrate_step_costs", broken)
    engine = _engine(0.040, calibrate_step_costs=True)
    assert engine.calibration_report == {"error": "RuntimeError: no device time"}
    assert not engine.prefill_policy.model.fitted
    decode = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    engine.add_request("a", list(range(1, 20)), decode)
    while engine.has_unfinished():
        engine.step()
