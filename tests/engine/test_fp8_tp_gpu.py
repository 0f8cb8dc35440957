# FP8 and tensor parallelism on real GPUs (skipped without CUDA, see tests/conftest.py; the
# tensor-parallel ones also without two GPUs): torch._scaled_mm against its torch twin, and a
# TP=2 group over NCCL with its collectives captured in CUDA graphs giving the one-GPU output.
import pytest
import torch

from engine import LLM, SamplingParams
from engine.models.fp8 import fp8_linear, fp8_matmul_ref, quantize_weight, uses_scaled_mm
from kernels.fp8_quant import quantize_fp8
from tests.hf_models import build_hf_model

pytestmark = pytest.mark.gpu
two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs"
)
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def test_scaled_mm_matches_its_torch_twin():
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("row-wise FP8 GEMMs need Hopper")
    torch.manual_seed(0)
    x = torch.randn(77, 4096, device="cuda", dtype=torch.bfloat16)
    w_q, w_scale = quantize_weight(torch.randn(1024, 4096, device="cuda") * 0.02)
    assert uses_scaled_mm(x, w_q)
    fast = fp8_linear(x, w_q, w_scale)
    x_q, x_scale = quantize_fp8(x)
    slow = fp8_matmul_ref(x_q, x_scale, w_q, w_scale, torch.bfloat16)
    rel = ((fast.float() - slow.float()).norm() / slow.float().norm()).item()
    assert rel < 1e-2  # both accumulate e4m3 products in float32; the outputs are bf16


@two_gpus
def test_tp2_with_graphs_matches_one_gpu(tmp_path):
    build_hf_model(tmp_path, "llama", num_attention_heads=8, num_key_value_heads=2)
    prompts = [[5, 6, 7], list(range(3, 90)), [9] * 40]
    options = dict(device="cuda", dtype="float32", num_kv_blocks=64, max_num_seqs=8)
    with LLM(str(tmp_path), **options) as one:
        want = [o.token_ids for o in one.generate(prompts, GREEDY)]
    with LLM(str(tmp_path), tensor_parallel_size=2, **options) as two:
        assert two.engine.runner.graphs is not None and two.engine.runner.graphs.graphs
        replays = []
        replay = two.engine.runner.graphs.replay
        two.engine.runner.graphs.replay = lambda batch: replays.append(1) or replay(batch)
        assert [o.token_ids for o in two.generate(prompts, GREEDY)] == want
        assert replays  # decode steps replayed graphs that hold the all-reduces


@two_gpus
def test_tp2_fp8_weights_and_kv_cache_serve_with_graphs():
    options = dict(device="cuda", dtype="bfloat16", num_kv_blocks=64, max_num_seqs=8)
    with LLM("tiny", tensor_parallel_size=2, quantization="fp8", kv_cache_dtype="fp8",
             **options) as llm:  # fmt: skip
        runner = llm.engine.runner
        assert runner.kv_caches.dtype == torch.float8_e4m3fn
        assert runner.model.model.layers[0].mlp.down_proj.weight.dtype == torch.float8_e4m3fn
        outs = llm.generate([[1, 2, 3], list(range(50))], GREEDY)
        assert [len(o.token_ids) for o in outs] == [24, 24]
