# Model shape, read from an HF config.json or a named preset. Imports no torch: the capacity
# planner and the API read shapes too.
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

# HF `architectures[0]` → our family name. All are the Llama block with small variations.
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


@dataclass(slots=True, frozen=True)
class ModelConfig:
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: bias on q/k/v projections
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k before rotary
    # Mistral v0.1 style local attention. The engine attends over the full context, which is
    # the same thing while the context fits the window, so it caps max_model_len to it.
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    dtype: str = "bfloat16"
    name: str = ""
    # The checkpoint's HF `quantization_config` (FP8 releases; see quant_config.py), or None.
    quantization_config: dict[str, Any] | None = field(default=None, compare=False)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.family not in ARCHITECTURES.values():
            raise ValueError(f"unsupported model family {self.family!r}")
        for attr in ("vocab_size", "hidden_size", "intermediate_size", "num_layers"):
            if getattr(self, attr) <= 0:
                raise ValueError(f"{attr} must be positive")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads (GQA)")
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            if kind not in ("llama3", "linear", "default"):
                raise ValueError(f"unsupported rope_scaling type {kind!r}")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def num_params(self) -> int:
        h, L = self.hidden_size, self.num_layers
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        if self.attention_bias:
            attn += self.q_size + 2 * self.kv_size
        if self.qk_norm:
            attn += 2 * self.head_dim
        mlp = 3 * h * self.intermediate_size
        per_layer = attn + mlp + 2 * h
        embed = self.vocab_size * h
        lm_head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return L * per_layer + embed + lm_head + h

    def kv_bytes_per_token(self, bytes_per_element: int = 2) -> int:
        # K and V, every layer, every KV head.
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * bytes_per_element

    def with_overrides(self, **kw: Any) -> ModelConfig:
        return replace(self, **kw)

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], name: str = "") -> ModelConfig:
        archs = d.get("architectures") or ["LlamaForCausalLM"]
        family = ARCHITECTURES.get(archs[0])
        if family is None:
            raise ValueError(
                f"unsupported architecture {archs[0]!r}; fleetlm serves {sorted(ARCHITECTURES)}"
            )
        num_heads = d["num_attention_heads"]
        head_dim = d.get("head_dim") or d["hidden_size"] // num_heads
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        rope_scaling = d.get("rope_scaling")
        window = d.get("sliding_window")
        if family in ("qwen2", "qwen3") and not d.get("use_sliding_window", False):
            window = None
        rope_theta = d.get("rope_theta")
        # transformers 5 nests rope settings under rope_parameters.
        params = d.get("rope_parameters")
        if isinstance(params, dict):
            rope_theta = params.get("rope_theta", rope_theta)
            if params.get("rope_type", "default") != "default":
                rope_scaling = params
        return cls(
            family=family,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=d.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            max_position_embeddings=d.get("max_position_embeddings", 4096),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta or 10000.0),
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", family == "qwen2")),
            qk_norm=family == "qwen3",
            sliding_window=window if isinstance(window, int) and window > 0 else None,
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            dtype=str(d.get("torch_dtype") or d.get("dtype") or "bfloat16"),
            name=name,
            quantization_config=d.get("quantization_config"),
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        with open(path / "config.json") as f:
            d = json.load(f)
        cfg = cls.from_hf_dict(d, name=path.name)
        gen = path / "generation_config.json"
        if gen.exists():
            eos = json.loads(gen.read_text()).get("eos_token_id")
            if eos is not None:
                ids = tuple(eos) if isinstance(eos, list) else (eos,)
                cfg = cfg.with_overrides(
                    eos_token_ids=tuple(dict.fromkeys(cfg.eos_token_ids + ids))
                )
        return cfg


_LLAMA31_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

# Real shapes of public checkpoints; the weights are random when built from a preset.
PRESETS: dict[str, ModelConfig] = {
    "llama-3.1-8b": ModelConfig(
        family="llama",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=_LLAMA31_ROPE,
        bos_token_id=128000,
        eos_token_ids=(128001, 128008, 128009),
        name="llama-3.1-8b",
    ),
    "llama-3.1-70b": ModelConfig(
        family="llama",
        vocab_size=128256,
        hidden_size=8192,
        intermediate_size=28672,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        head_dim=128,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=_LLAMA31_ROPE,
        bos_token_id=128000,
        eos_token_ids=(128001, 128008, 128009),
        name="llama-3.1-70b",
    ),
    "llama-3.2-1b": ModelConfig(
        family="llama",
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling={**_LLAMA31_ROPE, "factor": 32.0},
        tie_word_embeddings=True,
        bos_token_id=128000,
        eos_token_ids=(128001, 128008, 128009),
        name="llama-3.2-1b",
    ),
    "mistral-7b": ModelConfig(
        family="mistral",
        vocab_size=32768,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        max_position_embeddings=32768,
        rms_norm_eps=1e-5,
        rope_theta=1000000.0,
        bos_token_id=1,
        eos_token_ids=(2,),
        name="mistral-7b",
    ),
    "qwen2.5-7b": ModelConfig(
        family="qwen2",
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        head_dim=128,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        attention_bias=True,
        eos_token_ids=(151645, 151643),
        name="qwen2.5-7b",
    ),
    "qwen3-0.6b": ModelConfig(
        family="qwen3",
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        qk_norm=True,
        eos_token_ids=(151645, 151643),
        name="qwen3-0.6b",
    ),
    "qwen3-8b": ModelConfig(
        family="qwen3",
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_layers=36,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        qk_norm=True,
        eos_token_ids=(151645, 151643),
        name="qwen3-8b",
    ),
    # A few-MB model for tests and CPU demos. Its byte-level tokenizer decodes ids past the 256
    # bytes to one visible character each; a vocabulary of real size keeps random bytes (which
    # stream as held, invalid UTF-8) as rare as in a real model's output.
    "tiny": ModelConfig(
        family="llama",
        vocab_size=8192,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        eos_token_ids=(),
        dtype="float32",
        name="tiny",
    ),
}


# Llama 3.3 70B Instruct: the 3.1 70B's shape and tokenizer, its own weights.
PRESETS["llama-3.3-70b"] = PRESETS["llama-3.1-70b"].with_overrides(name="llama-3.3-70b")


def resolve_model_config(model: str | Path) -> ModelConfig:
    """A preset name or an HF checkpoint directory."""
    key = str(model)
    if key in PRESETS:
        return PRESETS[key]
    path = Path(model)
    if (path / "config.json").exists():
        return ModelConfig.from_dir(path)
    raise ValueError(
        f"model {key!r} is neither a preset ({', '.join(sorted(PRESETS))}) "
        "nor a directory with a config.json"
    )
