# The Llama block family in plain torch over a packed token batch: Llama 2/3, Mistral,
# Qwen2 (bias on q/k/v), Qwen3 (RMSNorm on each q/k head). GQA throughout; q/k/v and gate/up
# are fused projections, loaded shard by shard from HF checkpoints (see loader.py).
# Tensor parallel (tensor_parallel.py): each rank holds its query heads, its KV heads (copied
# when there are more ranks than KV heads), its slice of the MLP and of the vocabulary; o_proj
# and down_proj end in one all-reduce each. The model's `config` is this rank's shape (local
# head counts and MLP width, the full vocabulary).
# FP8 (quant_config.py): the four projections of every layer may hold e4m3 weights; at a decode
# step's row counts the norms and the SiLU-and-mul before FP8 ones emit e4m3 rows for them
# (fp8_activation.py).
from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
from torch import nn

from engine.models import fp8_activation, ops
from engine.models.config import ModelConfig
from engine.models.fp8_activation import Fp8Activation, rms_norm_to_fp8, silu_and_mul_to_fp8
from engine.models.linear import ColumnParallelLinear, Linear, RowParallelLinear
from engine.models.quant_config import Fp8Scheme
from engine.models.vocab_parallel import VocabParallelEmbedding
from engine.parallel.tensor_parallel import SINGLE, TensorParallel
from engine.runner.attention import AttentionMetadata, paged_attention

# (HF module prefix, its HF part names) → the FP8 scheme of the layer holding them, or None.
Fp8For = Callable[..., Fp8Scheme | None]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))
        self.eps = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, consumer: Linear | None = None
    ):
        """rms_norm(x (+ residual)) * weight (and x + residual); quantized for `consumer`, the
        layer it feeds, when that asks for e4m3 rows (Linear.takes_fp8_rows)."""
        if consumer is not None and consumer.takes_fp8_rows(x):
            return rms_norm_to_fp8(x, self.weight, self.eps, residual, *consumer.activation_quant())
        return ops.rms_norm(x, self.weight, self.eps, residual)


class LlamaAttention(nn.Module):
    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, tp: TensorParallel, fp8: Fp8For, prefix: str
    ) -> None:
        super().__init__()
        d = self.head_dim = config.head_dim
        q_start, self.num_heads = tp.split(config.num_heads, "num_attention_heads")
        kv_start, self.num_kv_heads = tp.kv_heads(config.num_kv_heads)
        self.q_size, self.kv_size = self.num_heads * d, self.num_kv_heads * d
        self.scale = self.head_dim**-0.5
        q, kv = (q_start * d, self.q_size), (kv_start * d, self.kv_size)
        self.qkv_proj = ColumnParallelLinear(
            config.hidden_size, [q, kv, kv], bias=config.attention_bias, dtype=dtype,
            fp8=fp8(prefix, "q_proj", "k_proj", "v_proj"),
        )  # fmt: skip
        self.o_proj = RowParallelLinear(
            q, config.hidden_size, dtype=dtype, fp8=fp8(prefix, "o_proj"), tp=tp
        )
        self.qk_norm = config.qk_norm
        if self.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, dtype)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, dtype)
        # An FP8 KV cache stores K / k_scale and V / v_scale (the checkpoint's, else 1; a float
        # cache ignores them).
        self.k_scale = 1.0
        self.v_scale = 1.0

    def project(
        self,
        hidden: torch.Tensor | Fp8Activation,  # [num_tokens, hidden]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim]
        (q and k before rotary: attend() rotates them as it writes the cache)"""
        qkv = self.qkv_proj(hidden)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm:
            q = self.q_norm(q.reshape(-1, self.head_dim))
            k = self.k_norm(k.reshape(-1, self.head_dim))
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        return q, k, v

    def attend(
        self, q, k, v, meta: AttentionMetadata, kv_cache: torch.Tensor, positions, cos_sin,
        out=None,
    ) -> torch.Tensor:  # fmt: skip
        """Rotary on q and k (in place), their K/V into the cache, attention.
        kv_cache: [2, num_blocks, block_size, num_kv_heads, head_dim] → [T, heads, dim] (into
        `out` when given)"""
        return paged_attention(
            q, k, v, kv_cache[0], kv_cache[1], meta, self.scale, self.k_scale, self.v_scale, out,
            rotary=(positions, cos_sin),
        )  # fmt: skip

    def output(self, attn: torch.Tensor) -> torch.Tensor:
        return self.o_proj(attn.reshape(-1, self.q_size))

    def forward(self, positions, hidden, meta, kv_cache, cos_sin) -> torch.Tensor:
        q, k, v = self.project(hidden)
        return self.output(self.attend(q, k, v, meta, kv_cache, positions, cos_sin))


class LlamaMLP(nn.Module):
    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, tp: TensorParallel, fp8: Fp8For, prefix: str
    ) -> None:
        super().__init__()
        cols = tp.split(config.intermediate_size, "intermediate_size")
        self.gate_up_proj = ColumnParallelLinear(
            config.hidden_size, [cols, cols], bias=False, dtype=dtype,
            fp8=fp8(prefix, "gate_proj", "up_proj"),
        )  # fmt: skip
        self.down_proj = RowParallelLinear(
            cols, config.hidden_size, dtype=dtype, fp8=fp8(prefix, "down_proj"), tp=tp
        )

    def forward(self, x: torch.Tensor | Fp8Activation) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # [num_tokens, 2 * intermediate]
        if fp8_activation.FUSE_SILU_MUL_QUANT and self.down_proj.takes_fp8_rows(gate_up):
            act = silu_and_mul_to_fp8(gate_up, *self.down_proj.activation_quant())
            return self.down_proj(act)
        return self.down_proj(ops.silu_and_mul(gate_up))


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, tp: TensorParallel, fp8: Fp8For, i: int
    ):
        super().__init__()
        self.self_attn = LlamaAttention(config, dtype, tp, fp8, f"model.layers.{i}.self_attn")
        self.mlp = LlamaMLP(config, dtype, tp, fp8, f"model.layers.{i}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)

    # A layer in two halves around attention, so a step's non-attention work can be captured
    # in CUDA graphs per token count while attention runs between them (piecewise_graphs.py).
    def before_attention(self, hidden, residual):
        """→ q, k, v (before rotary) and the residual stream (hidden, residual:
        [num_tokens, hidden])"""
        qkv_proj = self.self_attn.qkv_proj  # an FP8 one may take the norm's output in e4m3
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden, consumer=qkv_proj)
        else:
            hidden, residual = self.input_layernorm(hidden, residual, consumer=qkv_proj)
        q, k, v = self.self_attn.project(hidden)
        return q, k, v, residual

    def after_attention(self, attn, residual):
        """attn: [num_tokens, num_heads, head_dim] → (mlp output, residual)"""
        hidden, residual = self.post_attention_layernorm(
            self.self_attn.output(attn), residual, consumer=self.mlp.gate_up_proj
        )
        return self.mlp(hidden), residual

    def forward(self, positions, hidden, residual, meta, kv_cache, cos_sin):
        q, k, v, residual = self.before_attention(hidden, residual)
        attn = self.self_attn.attend(q, k, v, meta, kv_cache, positions, cos_sin)
        return self.after_attention(attn, residual)


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype, tp: TensorParallel, fp8: Fp8For):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, dtype, tp)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, dtype, tp, fp8, i) for i in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)


class LlamaForCausalLM(nn.Module):
    # HF checkpoint name → (our parameter name, shard index) for the fused projections.
    stacked_params: ClassVar[dict[str, tuple[str, int]]] = {
        "q_proj": ("qkv_proj", 0),
        "k_proj": ("qkv_proj", 1),
        "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype,
        tp: TensorParallel = SINGLE,
        fp8: Fp8Scheme | None = None,
    ):
        super().__init__()

        def fp8_for(prefix: str, *parts: str) -> Fp8Scheme | None:
            # A fused projection stays in the model dtype only if every part is skipped.
            if fp8 is None or not any(fp8.quantizes(f"{prefix}.{p}") for p in parts):
                return None
            return fp8

        self.model = LlamaModel(config, dtype, tp, fp8_for)
        attn, mlp = self.model.layers[0].self_attn, self.model.layers[0].mlp
        self.config = config.with_overrides(
            num_heads=attn.num_heads,
            num_kv_heads=attn.num_kv_heads,
            intermediate_size=mlp.down_proj.weight.shape[1],
        )
        self.tie_word_embeddings = config.tie_word_embeddings
        if not self.tie_word_embeddings:
            self.lm_head = VocabParallelEmbedding(config.vocab_size, config.hidden_size, dtype, tp)

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens]
        positions: torch.Tensor,  # [num_tokens]
        meta: AttentionMetadata,
        kv_caches: torch.Tensor,  # [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
        cos_sin: torch.Tensor,  # [max_positions, head_dim] float32
    ) -> torch.Tensor:
        hidden = self.model.embed_tokens(input_ids)
        residual = None
        for i, layer in enumerate(self.model.layers):
            hidden, residual = layer(positions, hidden, residual, meta, kv_caches[i], cos_sin)
        hidden, _ = self.model.norm(hidden, residual)
        return hidden  # [num_tokens, hidden]

    def compute_logits(
        self, hidden: torch.Tensor, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """[num_rows, vocab] in `dtype`. The matmul rounds to the model dtype either way, so
        asking for that dtype loses nothing and skips a float32 copy (decode graphs do)."""
        head = self.model.embed_tokens if self.tie_word_embeddings else self.lm_head
        return head.logits(hidden).to(dtype)
