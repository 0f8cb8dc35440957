# The engine's step in two halves (begin_step launches, finish_step collects) — what the worker
# uses to run its Redis round trip while the GPU works — and the step trace both fill.
import math

import numpy as np
import pytest

from engine import LLMEngine, SamplingParams
from engine.config import EngineConfig
from engine.runner.step_trace import summarize_steps

PARAMS = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _engine() -> LLMEngine:
    return LLMEngine(EngineConfig(model="tiny", device="cpu", num_kv_blocks=64))


def _run(engine: LLMEngine, split: bool) -> dict[str, list[int]]:
    for i in range(3):
        engine.add_request(f"r{i}", list(range(5 + 7 * i)), PARAMS)
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished():
        deltas = engine.finish_step(engine.begin_step()) if split else engine.step()
        for d in deltas:
            tokens.setdefault(d.request_id, []).extend(d.new_token_ids)
    return tokens


def test_begin_finish_gives_the_tokens_of_step():
    assert _run(_engine(), split=True) == _run(_engine(), split=False)


def test_no_changes_between_begin_and_finish():
    engine = _engine()
    engine.add_request("a", [1, 2, 3], PARAMS)
    step = engine.begin_step()
    with pytest.raises(RuntimeError):
        engine.add_request("b", [1, 2, 3], PARAMS)
    with pytest.raises(RuntimeError):
        engine.abort("a")
    with pytest.raises(RuntimeError):
        engine.begin_step()
    engine.finish_step(step)
    assert engine.abort("a")  # allowed again once the step is finished


def test_step_trace_records_every_step():
    engine = _engine()
    trace = engine.enable_step_trace(capacity=8, extra_fields=("exchange_io_s",))
    _run(engine, split=True)
    assert trace.num_recorded > 8  # a ring: the newest 8 rows are kept
    cols = trace.columns()
    assert len(cols["start"]) == 8 and np.all(np.diff(cols["start"]) >= 0)
    assert np.all(cols["wall_s"] > 0) and np.all(cols["num_tokens"] >= 1)
    assert np.all(np.isnan(cols["gpu_s"]))  # no GPU interval on the CPU
    assert np.all(np.isnan(cols["exchange_io_s"]))  # the worker's fields, left to the worker
    trace.update(trace.num_recorded - 1, exchange_io_s=0.5)
    assert trace.columns()["exchange_io_s"][-1] == 0.5
    summary = summarize_steps(cols)
    assert summary["steps"] == 8 and summary["wall_ms"]["p50"] > 0
    assert math.isnan(summary.get("gpu_busy_fraction", math.nan))
    engine.disable_step_trace()
    engine.add_request("after", [1, 2], PARAMS)
    engine.step()
    assert engine.step_trace is None
