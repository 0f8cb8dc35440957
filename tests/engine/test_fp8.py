# FP8 weights (quantization="fp8"): load-time quantization of every HF family, the error of
# each quantized layer, agreement with the unquantized model, the published FP8 checkpoint
# formats, and an FP8 preset built directly in e4m3.
#
# Agreement is measured teacher-forced: at every position of the unquantized model's greedy
# continuation, does the FP8 model pick the same next token? (Free-running outputs diverge for
# good after one differing token, so later positions compare different contexts.) Random-weight
# models are the hardest case there is: their next-token logits are nearly flat (the median gap
# between the top two is 0.2 standard deviations), so e4m3's 3 mantissa bits flip 20-30 % of
# their choices (bf16 flips 1-3 %), always between near-tied tokens. A trained model is
# confident; on the one that ships with the repository FP8 agrees on ~97 % of greedy tokens.
import random
from pathlib import Path

import pytest
import torch

from engine import LLM, SamplingParams
from engine.models import fp8_activation
from engine.models.fp8 import dequantize_weight
from engine.models.fp8_activation import Fp8Activation
from engine.models.linear import Linear
from engine.runner.attention import AttentionMetadata
from tests.fp8_checkpoints import write_fp8_checkpoint
from tests.hf_models import FAMILIES, VOCAB, build_hf_model

SHIPPED_MODEL = Path(__file__).resolve().parents[2] / "models" / "fleetlm-tiny-chat"
FP8 = torch.float8_e4m3fn


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(f"hf-{request.param}")
    build_hf_model(directory, request.param)
    return request.param, directory


def _llm(directory, **options) -> LLM:
    return LLM(str(directory), dtype="float32", device="cpu", num_kv_blocks=64, **options)


@torch.inference_mode()
def teacher_forced_logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    """Next-token logits [len(ids), vocab] at every position: one prefill through the model."""
    runner = llm.engine.runner
    n = len(ids)
    qsl = torch.tensor([0, n], dtype=torch.int32)
    blocks = torch.arange(-(-n // runner.block_size), dtype=torch.int32)
    meta = AttentionMetadata(
        slot_mapping=torch.arange(n), block_tables=blocks.view(1, -1),
        seq_lens=torch.tensor([n], dtype=torch.int32), query_start_loc=qsl, num_decodes=0,
        max_query_len=n, max_seq_len=n, prefill_query_start_loc=qsl,
    )  # fmt: skip
    hidden = runner.model(
        torch.tensor(ids), torch.arange(n), meta, runner.kv_caches, runner.cos_sin
    )
    return runner.model.compute_logits(hidden)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (e4m3 compared as bytes)."""
    if a.dtype == FP8:
        return b.dtype == FP8 and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a, b)


def test_every_fp8_layer_stays_within_e4m3_error(family):
    name, directory = family
    reference = dict(_llm(directory).engine.runner.model.named_modules())
    quantized = dict(_llm(directory, quantization="fp8").engine.runner.model.named_modules())
    layers = [name for name, m in quantized.items() if isinstance(m, Linear)]
    assert len(layers) == 4 * FAMILIES[name]["num_hidden_layers"]
    g = torch.Generator().manual_seed(0)
    for name in layers:
        q, w = quantized[name], reference[name]
        assert q.weight.dtype == FP8 and q.weight_scale.shape == (w.weight.shape[0],)
        # weights: round to nearest e4m3 is within 2^-4 of each value (subnormals: 2^-10 · scale)
        deq = dequantize_weight(q.weight, q.weight_scale, torch.float32)
        bound = torch.maximum(w.weight.abs() * 2**-4, q.weight_scale[:, None] * 2**-10)
        assert ((deq - w.weight).abs() <= bound * (1 + 1e-5)).all(), name
        # the layer (e4m3 weights and per-token e4m3 activations) against float32
        x = torch.randn(32, w.weight.shape[1], generator=g)
        with torch.inference_mode():
            exact, approx = w(x), q(x)
        rel = (approx - exact).norm() / exact.norm()
        assert 0 < rel < 0.08, (name, rel.item())


def test_fp8_disagrees_only_between_near_ties(family):
    _, directory = family
    reference, quantized = _llm(directory), _llm(directory, quantization="fp8")
    rng = random.Random(3)
    agree, total = 0, 0
    for _ in range(2):
        ids = [rng.randrange(2, VOCAB) for _ in range(150)]
        exact = teacher_forced_logits(reference, ids)
        approx = teacher_forced_logits(quantized, ids)
        assert (approx - exact).norm() / exact.norm() < 0.3
        picked = approx.argmax(-1)
        agree += (picked == exact.argmax(-1)).sum().item()
        total += len(ids)
        # how far below the reference's best the FP8 choice scores, in logit standard deviations
        lost = (exact.max(-1).values - exact.gather(1, picked[:, None])[:, 0]) / exact.std(-1)
        assert lost.max() < 1.25, lost.max().item()
    assert agree / total >= 0.6


def test_fp8_agrees_on_90_percent_of_greedy_tokens_of_a_trained_model():
    reference = LLM(str(SHIPPED_MODEL), device="cpu", num_kv_blocks=256)
    quantized = LLM(str(SHIPPED_MODEL), device="cpu", num_kv_blocks=256, quantization="fp8")
    texts = [
        "Return the number of", "The function", "Hello! Who are you?", "Raise ValueError if",
        "Open the file and", "Create a new", "This module provides", "If the argument is None,",
    ]  # fmt: skip
    prompts = [reference.tokenizer.encode(t) for t in texts]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    want = [o.token_ids for o in reference.generate(prompts, greedy)]
    # every prefix of the reference continuation, one greedy token each
    prefixes = [p + w[:k] for p, w in zip(prompts, want) for k in range(len(w))]
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    got = [o.token_ids[0] for o in quantized.generate(prefixes, one)]
    expected = [t for w in want for t in w]
    agreement = sum(a == b for a, b in zip(got, expected)) / len(expected)
    assert agreement >= 0.9, agreement


# -- pre-quantized checkpoints ---------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hf-llama-fp8-src")
    return directory, build_hf_model(directory, "llama", seed=4)


def test_fbgemm_fp8_checkpoint_loads_like_load_time_quantization(llama_dir, tmp_path):
    src, _ = llama_dir
    write_fp8_checkpoint(src, tmp_path / "fbgemm", "fbgemm_fp8")
    prequantized = _llm(tmp_path / "fbgemm")  # no option: the checkpoint says FP8
    at_load = _llm(src, quantization="fp8")
    model = prequantized.engine.runner.model
    assert model.model.layers[1].mlp.down_proj.weight.dtype == FP8
    mine, theirs = model.state_dict(), at_load.engine.runner.model.state_dict()
    assert mine.keys() == theirs.keys()
    for name, t in mine.items():  # the same per-channel e4m3 weights and scales, bit for bit
        assert _same(t, theirs[name]), name
    prompts = [[5, 6, 7, 8], list(range(20, 90))]
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    assert [o.token_ids for o in prequantized.generate(prompts, greedy)] == [
        o.token_ids for o in at_load.generate(prompts, greedy)
    ]


def test_fbgemm_modules_to_not_convert_stay_in_the_model_dtype(llama_dir, tmp_path):
    src, _ = llama_dir
    skip = ("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
            "model.layers.0.self_attn.v_proj", "model.layers.2.mlp.down_proj")  # fmt: skip
    write_fp8_checkpoint(src, tmp_path / "fbgemm", "fbgemm_fp8", skip=skip)
    layers = _llm(tmp_path / "fbgemm").engine.runner.model.model.layers
    reference = _llm(src).engine.runner.model.model.layers
    assert layers[0].self_attn.qkv_proj.weight.dtype == torch.float32
    assert torch.equal(layers[0].self_attn.qkv_proj.weight, reference[0].self_attn.qkv_proj.weight)
    assert layers[0].self_attn.o_proj.weight.dtype == FP8
    assert layers[2].mlp.down_proj.weight.dtype == torch.float32
    assert layers[2].mlp.gate_up_proj.weight.dtype == FP8


@pytest.mark.parametrize("fmt", ["compressed-tensors", "fp8"])
def test_static_per_tensor_checkpoint_loads(llama_dir, tmp_path, fmt):
    from safetensors.torch import load_file

    src, hf_model = llama_dir
    write_fp8_checkpoint(src, tmp_path / fmt, fmt, hf_model=hf_model)
    tensors = load_file(tmp_path / fmt / "model.safetensors")
    llm = _llm(tmp_path / fmt)
    attn = llm.engine.runner.model.model.layers[1].self_attn
    # per-tensor scales repeated over each shard's rows; the largest of q/k/v's input scales
    p = "model.layers.1.self_attn"
    q_rows = attn.q_size
    assert torch.all(attn.qkv_proj.weight_scale[:q_rows] == tensors[f"{p}.q_proj.weight_scale"])
    assert torch.all(attn.qkv_proj.weight_scale[q_rows:] != 0)
    want = max(tensors[f"{p}.{x}_proj.input_scale"].item() for x in "qkv")
    assert attn.qkv_proj.input_scale.item() == want
    assert torch.equal(
        attn.o_proj.weight.view(torch.uint8), tensors[f"{p}.o_proj.weight"].view(torch.uint8)
    )
    assert (attn.k_scale, attn.v_scale) == (0.5, 0.25)  # used by an FP8 KV cache only
    # static activation scales, then the same near-tie bound as load-time quantization
    ids = list(range(3, 160))
    exact = teacher_forced_logits(_llm(src), ids)
    approx = teacher_forced_logits(llm, ids)
    assert (approx - exact).norm() / exact.norm() < 0.3
    picked = approx.argmax(-1)
    assert (picked == exact.argmax(-1)).float().mean() >= 0.6


def test_fp8_kv_cache_holds_twice_the_tokens():
    budget = dict(device="cpu", dtype="bfloat16", cpu_kv_cache_bytes=2**20)
    bf16 = LLM("tiny", **budget).engine.runner
    fp8 = LLM("tiny", kv_cache_dtype="fp8", **budget).engine.runner
    assert fp8.kv_caches.dtype == FP8 and bf16.kv_caches.dtype == torch.bfloat16
    assert fp8.num_blocks == 2 * bf16.num_blocks


def test_fp8_preset_is_built_in_e4m3():
    llm = LLM("tiny", device="cpu", num_kv_blocks=16, quantization="fp8", kv_cache_dtype="fp8")
    runner = llm.engine.runner
    linears = [m for m in runner.model.modules() if isinstance(m, Linear)]
    assert linears and all(m.weight.dtype == FP8 and m.weight_scale.gt(0).all() for m in linears)
    assert runner.kv_caches.dtype == FP8
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
    assert len(out[0].token_ids) == 5


# -- activation quantization fused into the ops before the FP8 layers ------------------------


def _fp8_inputs(model) -> dict[str, list[str]]:
    """Per FP8 projection (qkv_proj, o_proj, ...), what each forward call received: "e4m3" (an
    Fp8Activation from the op before) or "float" (quantized by the layer itself)."""
    seen: dict[str, list[str]] = {}
    for name, m in model.named_modules():
        if isinstance(m, Linear) and m.fp8 is not None:
            kind = seen.setdefault(name.split(".")[-1], [])
            m.register_forward_pre_hook(
                lambda _, args, kind=kind: kind.append(
                    "e4m3" if isinstance(args[0], Fp8Activation) else "float"
                )
            )
    return seen


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("fmt", ["load-time", "fbgemm_fp8", "compressed-tensors"])
def test_fused_activation_quantization_gives_the_unfused_logits(
    llama_dir, tmp_path, monkeypatch, dtype, fmt
):
    # dynamic per-token scales, with fbgemm's amax cap, and a static per-tensor input scale
    src, hf_model = llama_dir
    directory = src if fmt == "load-time" else tmp_path / fmt
    if fmt != "load-time":
        write_fp8_checkpoint(src, directory, fmt, hf_model=hf_model)
    options = dict(dtype=dtype, device="cpu", num_kv_blocks=64)
    if fmt == "load-time":
        options["quantization"] = "fp8"
    monkeypatch.setattr(fp8_activation, "FUSE_SILU_MUL_QUANT", True)  # off by default (slower)
    llm = LLM(str(directory), **options)
    seen = _fp8_inputs(llm.engine.runner.model)
    short = list(range(3, 3 + fp8_activation.FUSED_MAX_ROWS))  # a decode step's row count
    long = list(range(3, 3 + fp8_activation.FUSED_MAX_ROWS + 1))  # a prompt chunk's
    fused = [teacher_forced_logits(llm, ids) for ids in (short, long)]
    n = len(llm.engine.runner.model.model.layers)
    want = {"qkv_proj": ["e4m3"] * n + ["float"] * n, "o_proj": ["float"] * 2 * n}
    want |= {"gate_up_proj": want["qkv_proj"], "down_proj": want["qkv_proj"]}
    assert seen == want
    monkeypatch.setattr(fp8_activation, "FUSE_ACTIVATION_QUANT", False)
    for name in seen:
        seen[name].clear()
    unfused = [teacher_forced_logits(llm, ids) for ids in (short, long)]
    assert all(kinds == ["float"] * 2 * n for kinds in seen.values())
    # the same e4m3 bits and scales either way, hence the same logits bit for bit
    assert all(torch.equal(a, b) for a, b in zip(fused, unfused))


def test_fused_activation_quantization_keeps_greedy_outputs(llama_dir, monkeypatch):
    src, _ = llama_dir
    prompts = [[5, 6, 7, 8], list(range(20, 90)), [9] * 30]
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outputs = {}
    monkeypatch.setattr(fp8_activation, "FUSE_SILU_MUL_QUANT", True)  # off by default (slower)
    for fuse in (True, False):
        monkeypatch.setattr(fp8_activation, "FUSE_ACTIVATION_QUANT", fuse)
        llm = _llm(src, quantization="fp8")
        seen = _fp8_inputs(llm.engine.runner.model)
        outputs[fuse] = [o.token_ids for o in llm.generate(prompts, greedy)]
        assert ("e4m3" in seen["down_proj"]) == fuse  # decode steps took the fused path
    assert outputs[True] == outputs[False]


def test_silu_mul_fusion_is_off_by_default(llama_dir):
    # measured slower on the H200 (fp8_activation.py): down_proj quantizes its own input, while
    # the norms still hand qkv_proj and gate_up_proj their rows quantized
    llm = _llm(llama_dir[0], quantization="fp8")
    seen = _fp8_inputs(llm.engine.runner.model)
    llm.generate([[5, 6, 7, 8]], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    assert "e4m3" in seen["qkv_proj"] and "e4m3" in seen["gate_up_proj"]
    assert "e4m3" not in seen["down_proj"]
