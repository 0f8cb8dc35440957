# Build a model on its target device and fill it: from an HF checkpoint directory (single or
# sharded *.safetensors), or with seeded random weights for a preset. Parameters are created on
# the meta device first so nothing is ever materialised twice (70B stays off the CPU).
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from engine.models.config import ModelConfig
from engine.models.llama import LlamaForCausalLM


def build_model(
    config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    checkpoint: Path | None,
    seed: int,
) -> LlamaForCausalLM:
    with torch.device("meta"):
        model = LlamaForCausalLM(config, dtype)
    model = model.to_empty(device=device)
    if checkpoint is None:
        init_dummy_weights(model, seed)
    else:
        load_checkpoint(model, checkpoint)
    return model.eval().requires_grad_(False)


@torch.no_grad()
def init_dummy_weights(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        elif name.endswith(".bias"):
            param.zero_()
        else:
            param.normal_(0.0, 0.02, generator=gen)


def checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / f for f in sorted(set(weight_map.values()))]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    return files


@torch.no_grad()
def load_checkpoint(model: LlamaForCausalLM, path: Path) -> None:
    params = dict(model.named_parameters())
    # Each fused parameter is complete once all its shards arrived.
    expected = {name: 1 for name in params}
    for name in params:
        for fused, _ in model.stacked_params.values():
            if f".{fused}." in name:
                expected[name] = len(model.shard_sizes(fused))
    loaded: dict[str, int] = dict.fromkeys(params, 0)
    device = next(iter(params.values())).device
    for file in checkpoint_files(path):
        with safe_open(str(file), framework="pt", device=str(device)) as f:
            for hf_name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if "rotary_emb" in hf_name:
                    continue
                if hf_name == "lm_head.weight" and model.tie_word_embeddings:
                    continue
                name, shard = _map_name(model, hf_name)
                if name not in params:
                    raise KeyError(f"checkpoint tensor {hf_name!r} has no place in the model")
                tensor = f.get_tensor(hf_name)
                param = params[name]
                if shard is None:
                    if tuple(tensor.shape) != tuple(param.shape):
                        raise ValueError(
                            f"{hf_name}: shape {tuple(tensor.shape)} != {tuple(param.shape)}"
                        )
                    param.copy_(tensor)
                else:
                    fused = name.split(".")[-2]
                    sizes = model.shard_sizes(fused)
                    start = sum(sizes[:shard])
                    param[start : start + sizes[shard]].copy_(tensor)
                loaded[name] += 1
    missing = [n for n, count in loaded.items() if count < expected[n]]
    if missing:
        raise ValueError(
            f"checkpoint {path} lacks weights for {missing[:5]}{'...' if len(missing) > 5 else ''}"
        )


def _map_name(model: LlamaForCausalLM, hf_name: str) -> tuple[str, int | None]:
    for hf_part, (fused, shard) in model.stacked_params.items():
        if f".{hf_part}." in hf_name:
            return hf_name.replace(f".{hf_part}.", f".{fused}."), shard
    return hf_name, None
