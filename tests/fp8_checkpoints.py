# Tiny FP8 checkpoints in the published on-disk formats, written from a float32 HF checkpoint
# (tests/hf_models.py): every decoder projection's weight becomes e4m3 with its scales beside it.
#   "fbgemm_fp8"          Meta's FP8 Llama 3.1 layout: weight_scale [out, 1] per channel,
#                         dynamic per-token activations (activation_scale_ub), and
#                         modules_to_not_convert kept in the original dtype.
#   "compressed-tensors"  per-tensor weight_scale [1] and a static per-tensor input_scale [1],
#                         calibrated on a prompt as the publishing tools do; k_scale / v_scale
#                         of an FP8 KV-cache scheme beside each attention.
#   "fp8"                 the older AutoFP8 layout of the same static per-tensor tensors.
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from engine.models.fp8 import quantize_weight

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
E4M3_MAX = 448.0


def is_projection(name: str) -> bool:
    return name.endswith(".weight") and name.split(".")[-2] in PROJECTIONS


def write_fp8_checkpoint(
    src: Path, dst: Path, fmt: str, *, skip: tuple[str, ...] = (), hf_model=None
) -> None:
    """Copy the checkpoint at `src` to `dst` in FP8 format `fmt`; `skip`: HF module names left
    as they are (fbgemm's modules_to_not_convert); `hf_model`: the HF model of `src`, to
    calibrate static input scales (compressed-tensors, fp8)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy2(f, dst / f.name)
    weights = load_file(src / "model.safetensors")
    input_amax = _calibrate(hf_model) if fmt != "fbgemm_fp8" else {}
    out: dict[str, torch.Tensor] = {}
    for name, w in weights.items():
        module = name.removesuffix(".weight")
        if not is_projection(name) or module in skip:
            out[name] = w
            continue
        if fmt == "fbgemm_fp8":
            q, scale = quantize_weight(w)
            out[name], out[f"{module}.weight_scale"] = q, scale[:, None]
        else:
            scale = w.float().abs().max() / E4M3_MAX
            out[name] = (w.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
            out[f"{module}.weight_scale"] = scale.reshape(1)
            out[f"{module}.input_scale"] = (input_amax[module] / E4M3_MAX).reshape(1)
            if module.endswith("k_proj"):  # an FP8 KV-cache scheme's per-layer scales
                attn = module.removesuffix(".k_proj")
                out[f"{attn}.k_scale"] = torch.tensor(0.5)
                out[f"{attn}.v_scale"] = torch.tensor(0.25)
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = _quantization_config(fmt, skip)
    (dst / "config.json").write_text(json.dumps(config, indent=1))


def _quantization_config(fmt: str, skip: tuple[str, ...]) -> dict:
    if fmt == "fbgemm_fp8":
        return {
            "quant_method": "fbgemm_fp8",
            "activation_scale_ub": 1200.0,
            "modules_to_not_convert": ["lm_head", *skip],
        }
    if fmt == "fp8":
        return {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]}
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": "tensor",
                            "dynamic": False, "symmetric": True},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor",
                                      "dynamic": False, "symmetric": True},
            }
        },
        "ignore": ["lm_head"],
    }  # fmt: skip


@torch.no_grad()
def _calibrate(hf_model) -> dict[str, torch.Tensor]:
    """The largest |input| each projection sees on a calibration prompt (with a margin)."""
    amax: dict[str, torch.Tensor] = {}
    hooks = []
    for name, module in hf_model.named_modules():
        if name.split(".")[-1] in PROJECTIONS:

            def hook(_m, args, _out, name=name):
                seen = args[0].abs().max().float()
                amax[name] = torch.maximum(amax.get(name, seen), seen)

            hooks.append(module.register_forward_hook(hook))
    try:
        ids = torch.arange(3, 200).remainder(hf_model.config.vocab_size - 8).unsqueeze(0)
        hf_model(ids)
    finally:
        for h in hooks:
            h.remove()
    return {name: a * 1.25 for name, a in amax.items()}
