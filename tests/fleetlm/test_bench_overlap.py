# `fleetlm bench engine`: with `--overlap both` one engine runs the workload with overlapped
# scheduling off, then on; both runs produce every token and report their overlap figures (the
# GPU idle ones are NaN on the CPU, where no CUDA events exist). `--repeats` times nano again.
import math

from engine import LLMEngine
from engine.config import EngineConfig
from fleetlm.bench.engine_bench import run_workload
from fleetlm.bench.workloads import BenchRequest


def test_the_engine_bench_runs_with_overlap_off_and_on():
    engine = LLMEngine(EngineConfig(model="tiny", device="cpu", num_kv_blocks=64))
    reqs = [BenchRequest(list(range(3, 3 + 5 * i)), 6 + i, "interactive", 0.0) for i in (1, 2, 3)]
    runs = {}
    for overlap in (False, True):
        engine.set_overlap_scheduling(overlap)
        runs[overlap] = run_workload(engine, reqs, detokenize=True)
    for overlap, r in runs.items():
        assert r["overlap_scheduling"] is overlap and not r["unexpected_finishes"]
        assert r["output_tokens"] == sum(q.max_tokens for q in reqs)
        assert math.isnan(r["gpu_idle_between_steps"]) and r["host_prepare_ms"]["p50"] > 0
    assert runs[False]["overlapped_steps"] == 0 and runs[True]["overlapped_steps"] > 0.5


def test_bench_engine_repeats_nano_and_leaves_the_roofline_to_a_gpu(tmp_path):
    # `--repeats 2`: two timed runs of the same requests on one engine, both in the JSON; the
    # roofline needs a GPU's measured ceilings, so on the CPU there is none.
    import json

    from fleetlm.cli import main

    out = tmp_path / "nano.json"
    argv = ["bench", "engine", "--model", "tiny", "--device", "cpu", "--workload", "nano",
            "--num-requests", "3", "--repeats", "2", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert list(result["runs"]) == ["all_at_once", "all_at_once#2"]
    first, second = result["runs"].values()
    assert first["output_tokens"] == second["output_tokens"] > 0
    assert result["roofline"] is None
