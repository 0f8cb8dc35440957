# Tensor parallelism on the CPU (gloo), one process per rank: rank 0 is this test's process, the
# followers are started by the engine. The ranks split query heads, KV heads (copied when there
# are more ranks than KV heads: mistral has one), the MLP and the vocabulary; the output must be
# the single-process output token for token. Also: one step broadcast per step, and a group
# that loses a process never lingers.
import os
import subprocess
import sys
import time

import pytest
import torch

from engine import LLM, SamplingParams
from engine.parallel.tensor_parallel import TensorParallel
from tests.hf_models import FAMILIES, VOCAB, build_hf_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
_SYSTEM = [(7 * i) % (VOCAB - 10) + 2 for i in range(40)]  # a shared prefix (prefix-cache hits)
PROMPTS = [
    [3], [9, 4, 77, 130, 2], list(range(2, 19)), list(range(100, 133)),
    [(5 * i) % (VOCAB - 10) + 2 for i in range(150)],
    [*_SYSTEM, 11, 12], _SYSTEM + list(range(40, 70)),
]  # fmt: skip


@pytest.fixture(autouse=True)
def one_thread_per_rank():
    # The ranks share this machine's cores: one intra-op thread each (the followers copy it).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _generate(directory, **options) -> list[list[int]]:
    with LLM(str(directory), dtype="float32", device="cpu", **options) as llm:
        first = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        again = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]  # prefix-cache hits
    assert first == again
    return first


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tp2_matches_one_process_token_for_token(family, tmp_path):
    build_hf_model(tmp_path, family)
    # Small steps: prompts are chunked, and decodes share steps with prefill chunks.
    options = dict(num_kv_blocks=96, max_num_batched_tokens=48)
    assert _generate(tmp_path, tensor_parallel_size=2, **options) == _generate(tmp_path, **options)


def test_tp4_over_eight_kv_heads(tmp_path):
    build_hf_model(tmp_path, "llama", num_attention_heads=16, num_key_value_heads=8)
    options = dict(num_kv_blocks=96)
    assert _generate(tmp_path, tensor_parallel_size=4, **options) == _generate(tmp_path, **options)


def test_one_broadcast_per_step_and_fp8_across_ranks(tmp_path, monkeypatch):
    build_hf_model(tmp_path, "llama")
    sent = []
    broadcast = TensorParallel.broadcast
    monkeypatch.setattr(
        TensorParallel, "broadcast", lambda self, obj=None: sent.append(obj) or broadcast(self, obj)
    )
    with LLM(str(tmp_path), dtype="float32", device="cpu", num_kv_blocks=64,
             tensor_parallel_size=2, quantization="fp8", kv_cache_dtype="fp8") as llm:  # fmt: skip
        steps = 0
        llm.engine.add_request("r", PROMPTS[3], GREEDY)
        while llm.engine.has_unfinished():
            deltas = llm.engine.step()
            steps += 1
        assert deltas[-1].finished and deltas[-1].usage.completion_tokens == 16
        assert len(sent) == steps  # rank 0 → followers: one packed batch per step
        assert all(p.sampling_requests == [] for p in sent)  # host objects stay on rank 0
    assert sent[-1] is None  # shutdown released the followers


def _start_group(script: str) -> tuple[subprocess.Popen, int]:
    """A TP=2 engine in its own process; returns it and its follower's pid."""
    code = (
        "import time, torch\n"
        "torch.set_num_threads(1)\n"
        "from engine import LLM\n"
        "llm = LLM('tiny', device='cpu', num_kv_blocks=16, tensor_parallel_size=2)\n"
        "print(llm.engine._followers.procs[0].pid, flush=True)\n" + script
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=root,
        env={**os.environ, "PYTHONPATH": root},
    )  # fmt: skip
    return proc, int(proc.stdout.readline())


def _gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] in ("Z", "X"):  # exited, not yet reaped
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def test_a_group_that_loses_a_process_does_not_linger():
    # rank 0 killed: its follower exits by itself
    proc, follower = _start_group("time.sleep(120)\n")
    proc.kill()
    proc.wait()
    assert _gone(follower, timeout_s=10)
    # a follower killed: rank 0 cannot step without it and exits (a supervisor restarts it)
    proc, follower = _start_group("time.sleep(120)\n")
    try:
        os.kill(follower, 9)
        assert proc.wait(timeout=20) == 70
    finally:
        proc.kill()
        proc.wait()
