# Rotary-embedding tables: inverse frequencies (with llama3 / linear scaling) and the
# cos/sin cache the rotary op indexes by position.
from __future__ import annotations

import math

import torch

from engine.models.config import ModelConfig


def inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    dim = config.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    inv_freq = 1.0 / (config.rope_theta**exponents)  # [head_dim // 2]
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif kind == "llama3":
        inv_freq = _llama3_scaled(inv_freq, scaling)
    return inv_freq


def _llama3_scaled(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, and the band in
    # between interpolated linearly in 1/wavelength.
    factor = float(s["factor"])
    low, high = float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_ctx = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    in_band = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
    return torch.where(in_band, blended, scaled)


def cos_sin_cache(config: ModelConfig, max_positions: int, device: torch.device) -> torch.Tensor:
    """[max_positions, head_dim] float32: cos in the first half of each row, sin in the second."""
    inv_freq = inverse_frequencies(config).to(device)
    positions = torch.arange(max_positions, dtype=torch.float32, device=device)
    freqs = positions[:, None] * inv_freq[None, :]  # [max_positions, head_dim // 2]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).contiguous()
