# Lower bounds on how long a forward pass can take, from bytes moved and FLOPs done.
#
# A step runs two kinds of kernels back to back, and each is held to its own roofline:
#   linear layers — stream the weights once, do 2 FLOPs per parameter per token;
#   attention     — stream the KV of every sequence, do 4·layers·heads·head_dim FLOPs per
#                   (query token, key token) pair: 2 for q·k, 2 for p·v.
# time ≥ max(weight bytes / BW, linear FLOPs / peak) + max(KV bytes / BW, attention FLOPs / peak).
# The sum (rather than one max over the whole step) is deliberate: the two phases don't
# overlap in real engines, and summing keeps a batch of 700 tokens from hiding its compute
# behind the KV reads of another kernel. When both phases are bandwidth-bound, as decode is,
# the sum is exactly (weights + KV bytes) / bandwidth.
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from fleetlm.capacity.deployment import Deployment


@dataclass(frozen=True, slots=True)
class Floor:
    seconds: float
    linear_s: float
    attention_s: float
    weight_bytes: float  # read
    kv_bytes: float  # read + written
    linear_flops: float
    attention_flops: float
    ridge_flop_per_byte: float

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes

    @property
    def flops(self) -> float:
        return self.linear_flops + self.attention_flops

    @property
    def arithmetic_intensity(self) -> float:
        return self.flops / self.bytes

    @property
    def linear_bound(self) -> str:
        return _bound(self.linear_flops, self.weight_bytes, self.ridge_flop_per_byte)

    @property
    def attention_bound(self) -> str:
        return _bound(self.attention_flops, self.kv_bytes, self.ridge_flop_per_byte)

    @property
    def bound(self) -> str:
        kinds = {self.linear_bound, self.attention_bound}
        return kinds.pop() if len(kinds) == 1 else "mixed"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "bytes": self.bytes,
            "flops": self.flops,
            "arithmetic_intensity": self.arithmetic_intensity,
            "bound": self.bound,
            "linear_bound": self.linear_bound,
            "attention_bound": self.attention_bound,
        }


def _bound(flops: float, nbytes: float, ridge: float) -> str:
    return "compute" if nbytes == 0 or flops / nbytes > ridge else "bandwidth"


def attention_flops_per_pair(dep: Deployment) -> int:
    m = dep.model
    return 4 * m.num_layers * m.num_heads * m.head_dim


def causal_pairs(new_tokens: float, cached_tokens: float = 0.0) -> float:
    # Query i (1-based) of a chunk sees the cached prefix and the i new tokens up to itself:
    # Σ (cached + i) = new·cached + new·(new+1)/2 — the ~tokens²/2 of causal attention.
    return new_tokens * cached_tokens + new_tokens * (new_tokens + 1) / 2


def forward_floor(
    dep: Deployment,
    *,
    tokens: float,
    logit_tokens: float,
    attention_pairs: float,
    kv_read_tokens: float,
    kv_write_tokens: float,
) -> Floor:
    bw, peak = dep.bandwidth_bytes_s, dep.peak_flops
    weight_bytes = float(dep.weight_bytes_read)
    linear_flops = 2.0 * (dep.layer_params * tokens + dep.lm_head_params * logit_tokens)
    kv_bytes = (kv_read_tokens + kv_write_tokens) * dep.kv_bytes_per_token
    attention_flops = float(attention_flops_per_pair(dep) * attention_pairs)
    linear_s = max(weight_bytes / bw, linear_flops / peak)
    attention_s = max(kv_bytes / bw, attention_flops / peak)
    return Floor(
        seconds=linear_s + attention_s,
        linear_s=linear_s,
        attention_s=attention_s,
        weight_bytes=weight_bytes,
        kv_bytes=kv_bytes,
        linear_flops=linear_flops,
        attention_flops=attention_flops,
        ridge_flop_per_byte=dep.ridge_flop_per_byte,
    )


def decode_floor(dep: Deployment, batch: int, context: float) -> Floor:
    """One decode step: `batch` sequences each emit a token, each attending to `context`."""
    if batch < 1:
        raise ValueError("batch must be at least 1")
    return forward_floor(
        dep,
        tokens=batch,
        logit_tokens=batch,
        attention_pairs=batch * context,
        kv_read_tokens=batch * context,
        kv_write_tokens=batch,
    )


def prefill_floor(dep: Deployment, prompt_tokens: float, cached_tokens: float = 0.0) -> Floor:
    """Prefill of one prompt alone on the replica; `cached_tokens` of it hit the prefix cache."""
    new = prompt_tokens - cached_tokens
    if new < 1:
        raise ValueError("prefill needs at least one uncached token")
    return forward_floor(
        dep,
        tokens=new,
        logit_tokens=1,  # only the last position's logits are sampled
        attention_pairs=causal_pairs(new, cached_tokens),
        kv_read_tokens=cached_tokens,
        kv_write_tokens=new,
    )


def decode_step_floor_s(dep: Deployment, batch: int, context: float) -> float:
    return decode_floor(dep, batch, context).seconds


def prefill_floor_s(dep: Deployment, prompt_tokens: float, cached_tokens: float = 0.0) -> float:
    return prefill_floor(dep, prompt_tokens, cached_tokens).seconds


def roofline_decode_tok_s(dep: Deployment, batch: int, context: float) -> float:
    """The most output tokens per second a decode-only batch can produce."""
    return batch / decode_step_floor_s(dep, batch, context)


def roofline_prefill_tok_s(dep: Deployment, prompt_tokens: float, batch: int = 1) -> float:
    # `batch` prompts of the same length prefilled together share one read of the weights.
    floor = forward_floor(
        dep,
        tokens=batch * prompt_tokens,
        logit_tokens=batch,
        attention_pairs=batch * causal_pairs(prompt_tokens),
        kv_read_tokens=0,
        kv_write_tokens=batch * prompt_tokens,
    )
    return batch * prompt_tokens / floor.seconds


def achieved_over_roofline(
    achieved_tok_s: float,
    dep: Deployment,
    *,
    phase: str = "decode",
    batch: int = 1,
    context: float = 0.0,
    prompt_tokens: float = 0.0,
) -> float:
    """Measured throughput as a fraction of the floor's, for benchmark reports.

    Build `dep` with `Deployment.create(..., bandwidth_bytes_s=..., flops=...)` from measured
    figures to compare against what the card actually sustains rather than the datasheet.
    Decode: `achieved_tok_s` counts output tokens of `batch` sequences at `context`.
    Prefill: it counts prompt tokens of `batch` prompts of `prompt_tokens` each.
    """
    if phase == "decode":
        ceiling = roofline_decode_tok_s(dep, batch, context)
    elif phase == "prefill":
        ceiling = roofline_prefill_tok_s(dep, prompt_tokens, batch)
    else:
        raise ValueError(f"phase must be 'decode' or 'prefill', not {phase!r}")
    return achieved_tok_s / ceiling
