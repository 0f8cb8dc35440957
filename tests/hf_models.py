# Random-weight HF checkpoints of each supported family, saved with a real tokenizer, for
# greedy-parity tests against transformers. Shapes are tiny but keep every variation: GQA,
# llama3 rope scaling, qkv bias, q/k norm with an explicit head_dim, tied embeddings.
from __future__ import annotations

from pathlib import Path

import torch

from tests.tokenizer_fixture import write_test_tokenizer

VOCAB = 512
BOS_ID, EOS_ID = 508, 509  # where the fixture tokenizer puts its special tokens

FAMILIES = {
    "llama": dict(
        cls="LlamaForCausalLM", config="LlamaConfig", num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    ),
    "mistral": dict(
        cls="MistralForCausalLM", config="MistralConfig", num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=1, sliding_window=None,
    ),
    "qwen2": dict(
        cls="Qwen2ForCausalLM", config="Qwen2Config", num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True,
    ),
    "qwen3": dict(
        cls="Qwen3ForCausalLM", config="Qwen3Config", num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, head_dim=32,
    ),
}  # fmt: skip


def build_hf_model(directory: Path, family: str, seed: int = 0, **overrides):
    """Save a random-weight float32 model + tokenizer into `directory`; return the HF model.
    `overrides`: config fields changed from the family's (e.g. num_key_value_heads)."""
    import transformers

    spec = dict(FAMILIES[family]) | overrides
    cls = getattr(transformers, spec.pop("cls"))
    config_cls = getattr(transformers, spec.pop("config"))
    config = config_cls(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=160,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        # Wider weights than HF's default spread the logits, so greedy argmax ties (where
        # float rounding could pick either token) are vanishingly rare.
        initializer_range=0.15,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=EOS_ID,
        tie_word_embeddings=spec.pop("tie_word_embeddings", False),
        **spec,
    )
    torch.manual_seed(seed)
    model = cls(config).to(torch.float32).eval()
    model.save_pretrained(directory, safe_serialization=True)
    write_test_tokenizer(directory, vocab_size=VOCAB)
    return model


@torch.no_grad()
def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """HF greedy continuation with EOS disabled (our side runs with ignore_eos)."""
    input_ids = torch.tensor([prompt_ids])
    out = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=EOS_ID,
    )
    return out[0, len(prompt_ids) :].tolist()
