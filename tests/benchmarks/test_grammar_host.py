# benchmarks/grammar_host.py on a few streams and steps: both runs decode, every grammar part of
# a constrained step is timed (and none in the plain run), and the JSON says so.
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_grammar_host_smoke(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "grammar_host.json"
    args = ["--streams", "3", "--steps", "4", "--properties", "5", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.grammar_host", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["vocab_size"] == 128256
    plain, schema = result["plain"]["parts_ms"], result["schema"]["parts_ms"]
    for part in ("fill", "fill_par", "apply", "read_ahead", "completed"):
        assert plain[part] == 0 and schema[part] > 0, part
    for part in ("schedule", "pack", "commit", "forward"):
        assert plain[part] > 0 and schema[part] > 0, part
    assert result["schema"]["grammar_host_ms"] > 0
    assert result["fill_scaling"]["one_row_median_ms"] > 0
    assert set(result["one_row_ms_by_vocab"]) == {"8192", "32768", "128256"}
