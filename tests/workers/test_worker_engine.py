# The worker's engine comes from the settings (Settings.engine_config()): every knob both name,
# speculative decoding included, and the usage counters it reports are the ones the metering
# codec carries.
from __future__ import annotations

from dataclasses import fields

from engine import SamplingParams
from engine.config import EngineConfig
from engine.usage import RequestUsage
from metering.models import UsageRecord
from service.settings import Settings
from workers.gpu.worker import build_engine


def test_the_engine_config_derives_from_the_settings():
    settings = Settings(
        _env_file=None, model="tiny", device="cpu", num_kv_blocks=64, block_size=32,
        max_num_seqs=7, max_num_batched_tokens=512, enable_prefix_caching=False,
        speculative_method="ngram", num_speculative_tokens=3, gpu_memory_utilization=0.5,
    )  # fmt: skip
    config = settings.engine_config()
    shared = {f.name for f in fields(EngineConfig)} & set(Settings.model_fields)
    # the knobs build_engine used to copy by hand are all derived
    assert shared >= {
        "model", "dtype", "device", "block_size", "num_kv_blocks", "gpu_memory_utilization",
        "max_num_batched_tokens", "max_num_seqs", "enable_prefix_caching",
        "speculative_method", "num_speculative_tokens", "draft_model",
    }  # fmt: skip
    for name in shared - {"max_model_len"}:
        assert getattr(config, name) == getattr(settings, name), name
    # the context the API admits against: capped by the KV pool
    assert config.max_model_len == settings.resolved_max_model_len() == 64 * 32


def test_every_usage_counter_has_its_usage_records_column():
    # What makes "a counter touches the engine, the record and a migration" true: metering
    # writes each counter of the record to the column of its name.
    columns = set(UsageRecord.__table__.columns.keys())
    assert {f.name for f in fields(RequestUsage)} <= columns


def test_worker_engine_speculates_when_configured():
    settings = Settings(model="tiny", device="cpu", num_kv_blocks=64, speculative_method="ngram")
    engine = build_engine(settings)
    assert engine.speculator is not None
    # `tiny`'s greedy output cycles, so prompt lookup finds continuations to propose.
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    engine.add_request("spec", [7, 8, 9, 10] * 6, params)
    last = None
    while engine.has_unfinished():
        for delta in engine.step():
            last = delta
    assert last.finished and last.usage.completion_tokens == 48
    assert last.usage.spec_proposed_tokens > 0
    assert 0 <= last.usage.spec_accepted_tokens <= last.usage.spec_proposed_tokens


def test_step_timing_trace_file(tmp_path):
    from workers.gpu.step_timing import WORKER_FIELDS, StepTiming, read_step_trace

    engine = build_engine(Settings(_env_file=None, model="tiny", device="cpu", num_kv_blocks=64))
    timing = StepTiming(engine, "w-trace", tmp_path)
    engine.add_request("a", list(range(9)), SamplingParams(max_tokens=12, ignore_eos=True))
    steps = 0
    while engine.has_unfinished():
        engine.step()
        timing.add(engine.last_step_row, exchange_io_s=0.001)
        timing.end_loop(engine.last_step_row, 0.0)
        steps += 1
    timing.flush(force=True)
    timing.close()
    cols = read_step_trace(tmp_path / "steps-w-trace.f64")
    assert set(WORKER_FIELDS) <= set(cols)
    assert len(cols["start"]) == steps
    assert (cols["exchange_io_s"] == 0.001).all() and (cols["loop_s"] > 0).all()


def test_the_worker_builds_the_grammar_vocabulary_before_taking_requests():
    # llguidance reads the vocabulary holding the interpreter lock (1-2 s at 128k ids): done at
    # start-up, the first constrained request compiles only its grammar.
    engine = build_engine(Settings(_env_file=None, model="tiny", device="cpu", num_kv_blocks=64))
    grammars = engine.grammars
    assert grammars._tokenizer is not None and grammars.num_compiled == 0
