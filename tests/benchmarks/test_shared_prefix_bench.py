# benchmarks/shared_prefix_bench.py in its --smoke form (CPU interpreter, tiny shapes): plain and
# shared-prefix attention run, agree, and the JSON says what was grouped.
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_shared_prefix_bench_smoke(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.shared_prefix_bench", "--smoke", "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["cache"] for r in rows] == ["bf16", "e4m3"]
    for r in rows:
        best = r["best"]
        assert best["grouped_rows"] >= 2 and best["bytes_read"] < r["kv_bytes"]
        assert best["rel_l2_vs_plain"] < 2e-2 and best["ms"] > 0
