# Overlapped scheduling (engine/runner/overlap.py) must not change what any request gets: the same
# tokens, text, finish reasons and billed tokens as the plain engine, across staggered arrivals,
# stop strings, EOS, stop ids, max_tokens, aborts, preemption and prefix caching; and no KV
# block may leak.
import pytest

from engine import LLMEngine
from engine.config import EngineConfig
from engine.core.request import PENDING_TOKEN
from tests.engine.overlap_workload import drive, pick_eos, plan, with_endings
from tests.hf_models import EOS_ID, build_hf_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("overlap")
    build_hf_model(directory, "llama", seed=11)
    return directory


def _engine(model_dir, overlap: bool, eos: int, **options) -> LLMEngine:
    options.setdefault("num_kv_blocks", 128)
    engine = LLMEngine(
        EngineConfig(model=str(model_dir), device="cpu", overlap_scheduling=overlap, **options)
    )
    # A token this model actually produces stands in for EOS, so EOS endings happen.
    engine.scheduler.eos_token_ids = frozenset({eos, EOS_ID})
    engine.runner.eos_token_ids = (eos, EOS_ID)
    return engine


@pytest.mark.parametrize("seeded", [False, True], ids=["greedy", "seeded"])
@pytest.mark.parametrize(
    "options",
    [{}, {"num_kv_blocks": 20, "max_num_batched_tokens": 64}, {"enable_prefix_caching": False}],
    ids=["roomy", "small-kv-preempts", "no-prefix-cache"],
)
def test_overlap_matches_plain(model_dir, seeded, options):
    planned = plan(3, seeded_sampling=seeded)
    base = drive(_engine(model_dir, False, EOS_ID, **options), planned)
    eos = pick_eos(planned, base)
    planned = with_endings(planned, base, eos)
    plain_engine = _engine(model_dir, False, eos, **options)
    plain = drive(plain_engine, planned)
    engine = _engine(model_dir, True, eos, **options)
    overlapped = drive(engine, planned)
    assert overlapped == plain
    reasons = {r.finish_reason for r in plain.values()}
    assert reasons == {"stop", "length", "abort"}
    assert any(eos == r.tokens[-1] for r in plain.values())  # an EOS ending among the stops
    for r in plain.values():
        assert r.completion_tokens == len(r.tokens)  # billed = streamed
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not engine.scheduler.requests
    if not options:  # the same steps, one late: the same prefixes published
        assert set(bm.cached_blocks) == set(plain_engine.block_manager.cached_blocks)
    assert engine.overlap.num_overlapped > 0 and engine.overlap.num_discarded > 0
    if "num_kv_blocks" in options:
        assert plain_engine.stats().num_preemptions > 0
        assert engine.overlap.num_synced + engine.stats().num_preemptions > 0


def test_worker_style_split_step_matches_plain(model_dir):
    planned = plan(5, seeded_sampling=True)
    base = drive(_engine(model_dir, False, EOS_ID), planned)
    planned = with_endings(planned, base, EOS_ID)
    plain = drive(_engine(model_dir, False, EOS_ID), planned, split=True)
    engine = _engine(model_dir, True, EOS_ID)
    assert drive(engine, planned, split=True) == plain
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_an_abort_leaves_the_state_the_plain_engine_leaves(model_dir):
    # Abort once the first token is out, with the prompt one short of a full block: the
    # overlapped request has sampled its second token meanwhile, which must not count, and
    # the first token's K/V (not computed in the plain engine) must not publish the block.
    from engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    states = []
    for overlap in (False, True):
        engine = _engine(model_dir, overlap, EOS_ID, block_size=16)
        engine.add_request("a", list(range(3, 18)), params)  # 15 tokens
        tokens, deltas = [], []
        while not tokens:
            for d in engine.step():
                tokens += d.new_token_ids
        request = engine.scheduler.requests["a"]
        assert PENDING_TOKEN not in request.token_ids[:-1]
        assert engine.abort("a")
        deltas = engine.step()
        (final,) = [d for d in deltas if d.request_id == "a"]
        assert final.finish_reason == "abort" and final.usage.completion_tokens == 1
        assert request.token_ids[-1] != PENDING_TOKEN
        bm = engine.block_manager
        states.append((tokens, request.num_computed_tokens, set(bm.cached_blocks)))
        assert bm.num_free_blocks == bm.num_blocks
    assert states[0] == states[1]


def test_decode_graph_buffers_are_fed_on_the_device():
    # The CPU runs a "replay" eagerly through the same static buffers (cuda_graphs.py): the
    # fed input ids must reach them before the forward reads them.
    from engine import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompts = [list(range(3, 3 + n)) for n in (5, 17, 33, 4)]
    plain = LLM("tiny", device="cpu", num_kv_blocks=64).generate(prompts, params)
    llm = LLM("tiny", device="cpu", num_kv_blocks=64, overlap_scheduling=True)
    llm.engine.runner.capture_graphs(8)
    graphs = llm.engine.runner.graphs
    replays = []
    replay = graphs.replay
    graphs.replay = lambda batch: replays.append(batch.fed_rows is not None) or replay(batch)
    for a, b in zip(plain, llm.generate(prompts, params)):
        assert a.token_ids == b.token_ids
    assert sum(replays) >= 10  # decode steps fed from the previous step's ids


def test_step_trace_marks_overlapped_steps():
    from engine import SamplingParams

    engine = LLMEngine(EngineConfig(model="tiny", device="cpu", overlap_scheduling=True))
    trace = engine.enable_step_trace()
    engine.add_request("a", list(range(3, 20)), SamplingParams(max_tokens=8, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    cols = trace.columns()
    assert cols["overlapped"].tolist() == [0.0] + [1.0] * (len(cols["overlapped"]) - 1)
    assert (cols["host_s"] > 0).all() and (cols["host_s"] <= cols["wall_s"]).all()
    assert (cols["sync_s"] == 0).all()  # nothing made it wait for committed tokens


def test_step_trace_times_the_sync_steps_wait_within_scheduling():
    from engine import SamplingParams

    engine = LLMEngine(EngineConfig(model="tiny", device="cpu", overlap_scheduling=True))
    trace = engine.enable_step_trace()
    # A penalty counts the request's last token: every step after the first syncs first.
    params = SamplingParams(max_tokens=8, ignore_eos=True, presence_penalty=0.5)
    engine.add_request("a", list(range(3, 20)), params)
    while engine.has_unfinished():
        engine.step()
    cols = trace.columns()
    synced = cols["sync_s"][1:]
    assert cols["sync_s"][0] == 0 and (synced > 0).all()
    assert (cols["sync_s"] <= cols["schedule_s"]).all()
    assert 0 < len(synced) <= engine.overlap.num_synced  # (the last commit syncs outside a step)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"speculative_method": "ngram"},
        {"speculative_method": "draft", "draft_model": "tiny"},
        {"tensor_parallel_size": 2},
    ],
)
def test_overlap_refuses_what_it_cannot_feed(kwargs):
    with pytest.raises(ValueError, match="overlap_scheduling"):
        EngineConfig(model="tiny", overlap_scheduling=True, **kwargs)


def test_the_worker_setting_reaches_the_engine():
    from service.settings import Settings

    settings = Settings(_env_file=None, model="tiny", device="cpu", overlap_scheduling=True)
    assert settings.engine_config().overlap_scheduling is True


@pytest.mark.parametrize("never_sync", [False, True])
def test_interactive_arrival_preempting_batch(model_dir, never_sync):
    # never_sync: the schedule preempts batch requests whose token is still on the device;
    # the victim waits with it and gets it at the commit, as if preempted a step later.
    from engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    results = []
    for overlap in (False, True):
        engine = _engine(model_dir, overlap, EOS_ID, num_kv_blocks=10)
        if overlap and never_sync:
            engine.overlap.needs_sync = lambda: False
        engine.add_request("batch-old", list(range(3, 63)), params, "batch")
        engine.add_request("batch-new", list(range(100, 160)), params, "batch")
        tokens: dict[str, list[int]] = {}
        reasons = {}
        for i in range(500):
            if i == 3:
                engine.add_request("chat", list(range(200, 250)), params, "interactive")
                engine.add_request("chat-2", list(range(300, 320)), params, "interactive")
            if i > 3 and not engine.has_unfinished():
                break
            for d in engine.step():
                tokens.setdefault(d.request_id, []).extend(d.new_token_ids)
                if d.finished:
                    reasons[d.request_id] = d.finish_reason
                    assert d.usage.completion_tokens == len(tokens[d.request_id])
        assert engine.stats().num_preemptions > 0
        assert engine.block_manager.num_free_blocks == 10
        results.append((tokens, reasons))
    assert results[0] == results[1]


def test_the_default_overlaps_only_where_there_is_something_to_overlap():
    # Auto (None): a CPU engine steps synchronously, so it stays plain; a speculating config
    # is accepted (auto never refuses) and stays plain too.
    assert EngineConfig(model="tiny").overlap_scheduling is None
    assert LLMEngine(EngineConfig(model="tiny", device="cpu")).overlap is None
    EngineConfig(model="tiny", speculative_method="ngram")
    forced = LLMEngine(EngineConfig(model="tiny", device="cpu", overlap_scheduling=True))
    assert forced.overlap is not None
