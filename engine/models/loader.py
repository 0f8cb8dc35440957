# Build a model on its target device and fill it: from an HF checkpoint directory (single or
# sharded *.safetensors), or with seeded random weights for a preset. Parameters are created on
# the meta device first so nothing is ever materialised twice (70B stays off the CPU), and each
# rank reads only its slices of the checkpoint's tensors (safetensors slices, straight to the
# device). FP8 layers quantize bf16/fp32 weights as they arrive (fp8.py).
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from engine.models.config import ModelConfig
from engine.models.fp8 import quantize_weight
from engine.models.linear import Linear, Source
from engine.models.llama import LlamaAttention, LlamaForCausalLM
from engine.models.quant_config import Fp8Scheme
from engine.parallel.tensor_parallel import SINGLE, TensorParallel

# Checkpoint tensors that fleetlm does not use.
# (output_scale / kv_scale: older FP8 KV-cache scales; the FP8 KV cache uses k_scale/v_scale.)
_UNUSED = ("rotary_emb", "weight_zero_point", "input_zero_point", "output_scale", "kv_scale")


def build_model(
    config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    checkpoint: Path | None,
    seed: int,
    tp: TensorParallel = SINGLE,
    fp8: Fp8Scheme | None = None,
) -> LlamaForCausalLM:
    with torch.device("meta"):
        model = LlamaForCausalLM(config, dtype, tp, fp8)
    model = _materialize(model, device)
    if checkpoint is None:
        init_dummy_weights(model, seed + tp.rank)
    else:
        load_checkpoint(model, checkpoint)
    return model.eval().requires_grad_(False)


def _materialize(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """Module.to_empty(device), with torch.empty_strided for its torch.empty_like: empty_like of
    a meta tensor runs torch's Python reference, whose first call imports sympy (1.8 s of a CPU
    worker's 6 s start-up, on every worker and tensor-parallel rank)."""
    return model._apply(
        lambda t: torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device)
    )


@torch.no_grad()
def init_dummy_weights(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, module in model.named_modules():
        if isinstance(module, Linear) and module.fp8 is not None:
            _init_fp8_linear(module, gen)
            continue
        for pname, param in module.named_parameters(recurse=False):
            if name.endswith("norm"):
                param.fill_(1.0)
            elif pname == "bias":
                param.zero_()
            else:
                param.normal_(0.0, 0.02, generator=gen)


def _init_fp8_linear(layer: Linear, gen: torch.Generator, rows: int = 4096) -> None:
    """N(0, 0.02) weights drawn and quantized a block of rows at a time: a 70B preset is built
    in FP8 without its bf16 weights ever existing."""
    w = layer.weight
    for start in range(0, w.shape[0], rows):
        block = torch.empty(min(rows, w.shape[0] - start), w.shape[1], device=w.device)
        block.normal_(0.0, 0.02, generator=gen)
        q, scale = quantize_weight(block)
        w[start : start + block.shape[0]].copy_(q)
        layer.weight_scale[start : start + block.shape[0]].copy_(scale)
    if layer.bias is not None:
        layer.bias.zero_()
    layer.input_scale = None


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
    modules = dict(model.named_modules())
    device = next(model.parameters()).device
    # Plain modules (norms): their parameters, each filled once from a whole tensor.
    pending = {
        f"{name}.{p}" for name, m in modules.items() if not hasattr(m, "load")
        for p, _ in m.named_parameters(recurse=False)
    }  # fmt: skip
    for file in checkpoint_files(path):
        with safe_open(str(file), framework="pt", device=str(device)) as f:
            for hf_name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if any(part in hf_name for part in _UNUSED):
                    continue
                if hf_name == "lm_head.weight" and model.tie_word_embeddings:
                    continue
                module_name, attr, shard = _place(model, hf_name)
                module = modules.get(module_name)
                if module is None:
                    raise KeyError(f"checkpoint tensor {hf_name!r} has no place in the model")
                if isinstance(module, LlamaAttention) and attr in ("k_scale", "v_scale"):
                    setattr(module, attr, float(f.get_tensor(hf_name).float().item()))
                elif hasattr(module, "load"):
                    module.load(attr, shard, _source(f, hf_name))
                else:
                    _copy_whole(module, attr, f.get_tensor(hf_name), hf_name)
                    pending.discard(f"{module_name}.{attr}")
    missing = sorted(pending)
    for name, module in modules.items():
        if hasattr(module, "missing"):
            missing += [f"{name}.{what}" for what in module.missing()]
        if isinstance(module, Linear):
            module.after_load()
    if missing:
        raise ValueError(
            f"checkpoint {path} lacks weights for {missing[:5]}{'...' if len(missing) > 5 else ''}"
        )


def _place(model: LlamaForCausalLM, hf_name: str) -> tuple[str, str, int]:
    """ "model.layers.0.self_attn.k_proj.weight_scale" → ("model.layers.0.self_attn.qkv_proj",
    "weight_scale", 1)."""
    module_name, _, attr = hf_name.rpartition(".")
    prefix, _, last = module_name.rpartition(".")
    if last in model.stacked_params:
        fused, shard = model.stacked_params[last]
        return f"{prefix}.{fused}", attr, shard
    return module_name, attr, 0


def _source(f, name: str) -> Source:
    """A checkpoint tensor read lazily: a rank reads only its rows or columns."""
    sl = f.get_slice(name)
    shape = tuple(sl.get_shape())

    def read(rows: slice | None, cols: slice | None) -> torch.Tensor:
        if rows is None and cols is None:
            return f.get_tensor(name)
        rows = rows if rows is not None else slice(None)
        if len(shape) < 2:
            return sl[rows]
        return sl[rows, cols if cols is not None else slice(None)]

    return Source(shape, read)


def _copy_whole(module: torch.nn.Module, attr: str, tensor: torch.Tensor, hf_name: str) -> None:
    param = getattr(module, attr, None)
    if not isinstance(param, torch.Tensor):
        raise KeyError(f"checkpoint tensor {hf_name!r} has no place in the model")
    if tuple(tensor.shape) != tuple(param.shape):
        raise ValueError(f"{hf_name}: shape {tuple(tensor.shape)} != {tuple(param.shape)}")
    param.copy_(tensor)
