# The worker's profiler (workers/gpu/profiling.py) on the tiny engine: it records at most max_steps
# engine steps, writes the trace when that window ends (or at a stop before it), and a stop after
# the window hands back the trace already written.
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine import LLMEngine, SamplingParams
from engine.config import EngineConfig
from workers.gpu.profiling import StepProfiler

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine(EngineConfig(model="tiny", device="cpu", num_kv_blocks=32))


def _run(engine: LLMEngine, profiler: StepProfiler, num_steps: int) -> None:
    engine.add_request(f"r{id(profiler)}", list(range(1, 20)), SamplingParams(max_tokens=50))
    for _ in range(num_steps):
        profiler.step()
        engine.step()
    engine.abort(f"r{id(profiler)}")
    while engine.has_unfinished():
        engine.step()


def _step_names(trace: str) -> set[str]:
    events = json.loads(Path(trace).read_text())["traceEvents"]
    return {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}


def test_the_window_closes_after_max_steps_and_writes_the_trace(engine, tmp_path):
    profiler = StepProfiler(tmp_path, "w1", engine.device, max_steps=3)
    assert profiler.start() == {"started": True}
    assert profiler.start() == {"started": False}  # already recording
    _run(engine, profiler, num_steps=6)
    assert not profiler.recording
    (trace,) = tmp_path.iterdir()
    assert len(_step_names(str(trace))) == 3
    assert profiler.stop() == {"trace": str(trace.resolve())}
    assert profiler.stop() == {"trace": None}


def test_a_stop_inside_the_window_writes_what_was_recorded(engine, tmp_path):
    profiler = StepProfiler(tmp_path, "w2", engine.device, max_steps=100)
    profiler.start()
    _run(engine, profiler, num_steps=2)
    assert profiler.recording
    trace = profiler.stop()["trace"]
    assert trace is not None and trace.startswith(str(tmp_path.resolve()))
    assert 1 <= len(_step_names(trace)) <= 3  # the steps run, not the window's 100
    assert profiler.start() == {"started": True}  # a new profile after a stop
    profiler.stop()
