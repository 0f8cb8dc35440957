# FP8 weights: which scheme a model runs, from the engine option and the checkpoint's
# `quantization_config`. Imports no torch (the engine config validates against it).
#
# Every scheme stores a linear layer as e4m3 weights with one float32 scale per output channel
# (a per-tensor checkpoint scale is repeated over its rows) and quantizes activations to e4m3
# per token at run time, unless the checkpoint ships static per-tensor input scales.
# Checkpoints read (tensor names beside each `weight`):
#   fbgemm_fp8          Meta's FP8 Llama 3.1 releases: weight_scale [out, 1], dynamic per-token
#                       activations capped by activation_scale_ub; modules_to_not_convert stay
#                       in bf16.
#   compressed-tensors  float-quantized releases: weight_scale (per tensor [1] or per channel
#                       [out, 1]), input_scale [1] when activations are static; `ignore` lists
#                       module names or "re:" patterns left unquantized.
#   fp8                 the older AutoFP8 layout: weight_scale / input_scale per tensor,
#                       activation_scheme "static" or "dynamic"; ignored_layers.
# A bf16/fp32 checkpoint or a preset with quantization="fp8" is quantized while it loads.
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

CHECKPOINT_METHODS = ("fbgemm_fp8", "compressed-tensors", "fp8")


@dataclass(frozen=True, slots=True)
class Fp8Scheme:
    source: str  # "load-time" or the checkpoint's quant_method
    static_input_scales: bool = False  # the checkpoint carries input_scale per layer
    activation_scale_ub: float = 0.0  # cap of a token's dynamic amax (0: none)
    skip: tuple[str, ...] = ()  # HF module names, or "re:<pattern>", kept in the model dtype

    def quantizes(self, hf_module: str) -> bool:
        """Whether the HF module (e.g. "model.layers.0.self_attn.q_proj") is stored in FP8."""
        for pattern in self.skip:
            if pattern.startswith("re:"):
                if re.fullmatch(pattern[3:], hf_module):
                    return False
            elif hf_module == pattern or hf_module.endswith("." + pattern):
                return False
        return True


def fp8_scheme(quantization: str | None, checkpoint: dict[str, Any] | None) -> Fp8Scheme | None:
    """The scheme for an engine option (None or "fp8") and a checkpoint's quantization_config
    (None for a plain checkpoint). A pre-quantized checkpoint runs in FP8 without the option."""
    if quantization not in (None, "fp8"):
        raise ValueError(f"quantization must be None or 'fp8', got {quantization!r}")
    if checkpoint is None:
        return Fp8Scheme("load-time") if quantization == "fp8" else None
    method = checkpoint.get("quant_method")
    if method == "fbgemm_fp8":
        return Fp8Scheme(
            method,
            activation_scale_ub=float(checkpoint.get("activation_scale_ub") or 0.0),
            skip=tuple(checkpoint.get("modules_to_not_convert") or ()),
        )
    if method == "fp8":
        if checkpoint.get("weight_block_size"):
            raise ValueError("block-wise FP8 checkpoints (weight_block_size) are not supported")
        return Fp8Scheme(
            method,
            static_input_scales=checkpoint.get("activation_scheme", "dynamic") == "static",
            skip=tuple(checkpoint.get("ignored_layers") or ()),
        )
    if method == "compressed-tensors":
        return Fp8Scheme(
            method,
            static_input_scales=_compressed_tensors_static(checkpoint),
            skip=tuple(checkpoint.get("ignore") or ()),
        )
    raise ValueError(
        f"unsupported checkpoint quantization {method!r}; fleetlm reads {CHECKPOINT_METHODS}"
    )


def _compressed_tensors_static(config: dict[str, Any]) -> bool:
    """Whether activations use static per-tensor scales; rejects anything but FP8 8-bit floats
    with per-tensor or per-channel weights."""
    static = False
    for name, group in (config.get("config_groups") or {}).items():
        weights = group.get("weights") or {}
        if weights.get("type") != "float" or weights.get("num_bits") != 8:
            raise ValueError(f"compressed-tensors group {name!r} is not FP8 (e4m3) weights")
        if weights.get("strategy") not in ("tensor", "channel"):
            raise ValueError(
                f"compressed-tensors group {name!r}: weight strategy "
                f"{weights.get('strategy')!r} is not supported (tensor or channel)"
            )
        acts = group.get("input_activations")
        if acts is not None and not acts.get("dynamic", False):
            if acts.get("strategy") != "tensor":
                raise ValueError(
                    f"compressed-tensors group {name!r}: static activations must be per tensor"
                )
            static = True
    return static
