# benchmarks/sweeps/prefill_ws_diagnose.py: its row classification on made-up outputs, a hanging
# child reported (not fatal), and the whole run in its --smoke form (CPU interpreter, tiny shapes).
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from benchmarks.sweeps import prefill_ws_diagnose as diag

ROOT = Path(__file__).resolve().parents[2]


def test_analyze_classifies_rows():
    # two sequences of 10 and 16 tokens, 4 heads, tiles of 4 queries
    qsl = torch.tensor([0, 10, 26])
    seq_of, pos_of = diag.token_positions(qsl, 26)
    assert seq_of.tolist() == [0] * 10 + [1] * 16 and pos_of[10:].tolist() == list(range(16))
    ref = torch.randn(26, 4, 8)
    out = ref.clone().to(torch.bfloat16)
    out[3, 1, 2] = float("nan")  # seq 0, pos 3: tile 0, row 3
    out[15, 0] = float("nan")  # seq 1, pos 5: tile 1, row 1
    out[20, 2] = diag.SENTINEL  # never written
    out[25, 3] = 0.0  # all zero where the reference is not
    out[22, 1] += 1.0  # finite but wrong: seq 1, pos 12, tile 3
    lse = torch.zeros(26, 4)
    lse[3, 1], lse[15, 0] = float("-inf"), float("nan")
    res = diag.analyze(out, ref, lse, torch.zeros(26, 4), seq_of, pos_of, block_m=4)
    assert (res["rows"], res["nan_rows"], res["unwritten_rows"]) == (104, 2, 1)
    assert res["nan_element_frac"] == pytest.approx(9 / (104 * 8))
    assert res["zero_rows"] == 1 and res["wrong_rows"] == 2  # the zero row is wrong too
    nan = res["nan"]
    assert [(e["token"], e["head"], e["tile"], e["row_in_tile"]) for e in nan["examples"]] == [
        (3, 1, 0, 3),
        (15, 0, 1, 1),
    ]
    assert nan["examples"][0]["nan_dims"] == 1 and nan["examples"][1]["nan_dims"] == 8
    assert nan["by_row_in_tile"] == [0, 1, 0, 1] and nan["by_head"] == [1, 1, 0, 0]
    assert nan["by_tile"][:2] == [1, 1] and nan["by_seq"] == [1, 1]
    assert nan["lse_at_rows"] == {"nan": 1, "neg_inf": 1, "unwritten": 0, "finite": 0}
    assert res["unwritten"]["examples"][0]["token"] == 20
    by_tile = res["max_abs_by_tile"]  # tile = position in the chunk // block_m, any sequence
    assert max(by_tile[:3]) < 0.1 and by_tile[3] > 0.9
    assert res["lse"]["nan"] == 1 and res["lse"]["neg_inf"] == 1
    diag.print_analysis("ws/chunk", res, 4)  # the log's text from the same dict


def test_compiled_kernels_lists_and_dumps(tmp_path):
    # the GPU-only report of what Triton compiled, on a stand-in for a JITFunction's caches
    from collections import namedtuple
    from types import SimpleNamespace

    meta = namedtuple("Meta", "num_warps num_stages shared global_scratch_size target")
    kernel = SimpleNamespace(
        hash="0123456789abcdef", n_regs=168, n_spills=0,
        src=SimpleNamespace(constants={(1,): 128, (2,): True, ("x",): 0}),
        metadata=meta(4, 2, 200_000, 384, "cuda:90"),
        asm={"ttgir": "ttg.warp_specialize partition0 partition1", "ptx": "// ptx"},
    )  # fmt: skip
    caches = {0: ({"key": kernel}, None, None, None, None)}  # (kernel_cache, ...) per device
    jit_fn = SimpleNamespace(arg_names=["q_ptr", "BLOCK_M", "WARP_SPEC"], device_caches=caches)
    [info] = diag.compiled_kernels(jit_fn, str(tmp_path), "chunk")
    assert info["BLOCK_M"] == 128 and info["WARP_SPEC"] is True and info["n_regs"] == 168
    assert info["ttgir_warp_specialize"] and info["ttgir_partitions"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "chunk_ws1_0123456789ab.ptx",
        "chunk_ws1_0123456789ab.ttgir",
    ]
    assert diag.compiled_kernels(SimpleNamespace(), None, "x") == []  # the interpreter's


def test_run_case_reports_a_hang():
    code = "import time; print('@step [0 s] stuck in a kernel', flush=True); time.sleep(60)"
    entry = diag.run_case({"case": [1, 0, 8]}, 5.0, True, cmd=[sys.executable, "-c", code])
    assert entry["status"].startswith("HANG") and entry["result"] is None
    assert entry["last_step"] == "[0 s] stuck in a kernel"
    entry = diag.run_case({"case": [1, 0, 8]}, 30.0, True, cmd=[sys.executable, "-c", "1/0"])
    assert entry["status"] == "died (rc 1)"


def test_sigterm_takes_the_running_child(tmp_path):
    # the job's `timeout` signals the parent only (the child has its own session): the parent
    # must kill the child, which would otherwise hold the GPU while the sweep runs
    pid_file = tmp_path / "child.pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    parent = (
        "import signal, sys; from benchmarks.sweeps import prefill_ws_diagnose as d; "
        "signal.signal(signal.SIGTERM, d._on_sigterm); "
        f"d.run_case({{'case': [1, 0, 8]}}, 60.0, True, cmd=[sys.executable, '-c', {child!r}])"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", parent], cwd=ROOT, env=env)
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    child_pid = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    for _ in range(100):  # killed; reaped by init once orphaned
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{child_pid}/stat").read_text().split()[2] == "Z":
            break
        time.sleep(0.1)
    else:
        os.kill(child_pid, signal.SIGKILL)
        pytest.fail("the child outlived its parent's SIGTERM")


@pytest.mark.slow
def test_prefill_ws_diagnose_smoke(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    out = tmp_path / "diagnose.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.sweeps.prefill_ws_diagnose", "--smoke",
         "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "==== prefill ws diagnose summary" in proc.stdout
    report = json.loads(out.read_text())
    assert [c["label"] for c in report["cases"]] == [diag.case_label(c) for c in diag.SMOKE_CASES]
    for case in report["cases"]:
        assert case["status"] == "ok", case
        variants = case["result"]["variants"]
        assert list(variants) == list(diag.VARIANTS)
        for name, v in variants.items():
            stages = ["final"] if name == "plain" else ["chunk", "final"]
            for stage in stages:
                r = v[stage]
                assert not (r["nan_rows"] or r["unwritten_rows"] or r["wrong_rows"]), (name, r)
            if name != "plain":
                assert v["chunk"]["lse"]["wrong"] == 0
        assert case["result"]["comparisons"]["ws vs ws-again"]["bit_identical"]
