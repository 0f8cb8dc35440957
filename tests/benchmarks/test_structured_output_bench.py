# benchmarks/structured_output.py on the tiny preset (CPU): a run long enough for the new schema
# to arrive reports the step times around it; one too short (--max-tokens below 22) reports
# that there was no such window instead of crashing; both carry the step trace's split.
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_bench(max_tokens: int) -> dict:
    args = ["--model", "tiny", "--streams", "3", "--max-tokens", str(max_tokens),
            "--properties", "4", "--prompt-len", "8"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.structured_output", *args],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout[proc.stdout.index("{") :])


@pytest.mark.slow
@pytest.mark.parametrize("max_tokens", [30, 12])
def test_structured_output_bench_smoke(max_tokens):
    result = run_bench(max_tokens)
    assert result["tpot_plain_ms"] > 0 and result["tpot_schema_ms"] > 0
    assert result["split_schema_ms"]["forward_ms"] > 0 and result["split_schema_ms"]["masks_ms"] > 0
    assert result["split_schema_ms"]["gpu_ms"] is None  # (CPU: no GPU interval)
    if max_tokens == 30:  # 10 steps in run C, the new schema at step 5
        assert result["step_max_ms_around_new_schema"] > 0
        assert result["new_schema_window"] == "steps 0-9, arrival at 5"
        slowest = result["slowest_step_around_new_schema"]
        assert 0 <= slowest["step"] < 10 and slowest["wall_ms"] > 0
        assert slowest["kernel_compiles"] >= 0 and slowest["num_seqs"] >= 1
    else:  # no step in run C at all
        assert result["step_max_ms_around_new_schema"] is None
        assert result["new_schema_window"].startswith("none:")
        assert result["slowest_step_around_new_schema"] is None
