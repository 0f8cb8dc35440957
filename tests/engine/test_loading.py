# Checkpoint loading: sharded safetensors with an index, config variants, the offline CLI.
import json

import pytest

from engine import LLM, SamplingParams
from engine.models.config import ModelConfig
from fleetlm import cli
from tests.hf_models import build_hf_model, hf_greedy

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def test_sharded_checkpoint_loads_like_a_single_file(tmp_path):
    single = tmp_path / "single"
    model = build_hf_model(single, "qwen2", seed=7)
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, safe_serialization=True, max_shard_size="100KB")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (sharded / name).write_bytes((single / name).read_bytes())
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    prompt = list(range(3, 40))
    want = hf_greedy(model, prompt, 12)
    for directory in (single, sharded):
        out = LLM(str(directory), device="cpu", num_kv_blocks=32).generate([prompt], GREEDY)[0]
        assert out.token_ids == want


def test_checkpoint_missing_a_weight_is_rejected(tmp_path):
    from safetensors.torch import load_file, save_file

    build_hf_model(tmp_path, "llama", seed=1)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="lacks weights"):
        LLM(str(tmp_path), device="cpu", num_kv_blocks=8)


def test_sliding_window_caps_the_context(tmp_path):
    cfg = ModelConfig.from_hf_dict(
        {
            "architectures": ["MistralForCausalLM"], "vocab_size": 100, "hidden_size": 32,
            "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 32768, "sliding_window": 4096,
        }
    )  # fmt: skip
    assert cfg.sliding_window == 4096
    qwen = ModelConfig.from_hf_dict(
        {
            "architectures": ["Qwen2ForCausalLM"], "vocab_size": 100, "hidden_size": 32,
            "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
            "sliding_window": 4096, "use_sliding_window": False,
        }
    )  # fmt: skip
    assert qwen.sliding_window is None
    build_hf_model(tmp_path, "mistral", seed=2)
    config = json.loads((tmp_path / "config.json").read_text())
    config["sliding_window"] = 256
    (tmp_path / "config.json").write_text(json.dumps(config))
    llm = LLM(str(tmp_path), device="cpu", num_kv_blocks=64)
    assert llm.engine.max_model_len == 256
    with pytest.raises(ValueError, match="sliding window"):
        LLM(str(tmp_path), device="cpu", num_kv_blocks=64, max_model_len=512)


def test_generate_cli_streams_text(capsys):
    code = cli.main(
        ["generate", "--model", "tiny", "--prompt", "hello", "--max-tokens", "7", "--device", "cpu",
         "--ignore-eos", "--stats"]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0
    assert "[length] prompt 5 tokens, output 7 tokens" in captured.err


def test_generate_cli_reports_bad_input(capsys):
    code = cli.main(["generate", "--model", "no-such-model", "--prompt", "x"])
    assert code == 2
    assert "neither a preset" in capsys.readouterr().err
