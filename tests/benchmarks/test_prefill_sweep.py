# benchmarks/sweeps/prefill_sweep.py in its --smoke form (CPU interpreter, tiny shapes): every
# variant is probed in a child, checked and timed; a variant whose child fails is reported, not
# fatal.
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_prefill_sweep_smoke(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    out = tmp_path / "sweep.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.sweeps.prefill_sweep", "--smoke", "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sweep = json.loads(out.read_text())["prefill_sweep"]
    from benchmarks.sweeps.prefill_cases import variants

    rows = {r["variant"]: r for r in sweep["rows"]}
    assert set(variants(smoke=True)) | {"paged"} == set(rows)
    assert all(r["check"]["ok"] and r["ms"] for r in rows.values()), rows
    assert sweep["best"] in rows and not sweep["failed"] and not sweep["wrong"]
    assert sweep["other_shapes"] and "default" in sweep["finalists"]
    for by_shape in sweep["other_shapes"].values():
        assert {r["variant"] for r in by_shape} == set(sweep["finalists"])
        assert all(r["check"]["ok"] for r in by_shape)


def test_prefill_sweep_reports_a_failing_probe():
    from benchmarks.sweeps.prefill_sweep import measure, probe

    res = probe(["no such variant"], [[1, 0, 80]], True, time.monotonic() + 120)
    assert "KeyError" in res["no such variant"]["error"]
    row = measure("no such variant", None, {"shape": (1, 0, 80)}, [], 1.0, res["no such variant"])
    assert row["error"] and row["ms"] is None
