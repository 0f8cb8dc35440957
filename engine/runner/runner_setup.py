# From an EngineConfig to a ready ModelRunner: device, dtype, context length, the model and its
# KV pool, CUDA graphs. Every tensor-parallel rank builds its runner through build_runner, so
# all ranks agree on the pool, the context and the captured graphs (whose collectives must
# line up rank by rank).
from __future__ import annotations

from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.models.config import PRESETS, ModelConfig
from engine.parallel.tensor_parallel import SINGLE, TensorParallel
from engine.runner.kernel_warmup import warm_up_mixed_steps
from engine.runner.model_runner import ModelRunner

_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


def resolve_device(name: str, rank: int = 0, tp_size: int = 1) -> torch.device:
    """auto → cuda when available, else cpu; tensor-parallel rank r runs on cuda:r."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if tp_size > 1 and device.type == "cuda":
        return torch.device("cuda", rank)
    return device


def resolve_dtype(name: str, checkpoint_dtype: str, device: torch.device) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cpu":
        return torch.float32  # bf16 matmuls on the CPU are slow and not what tests compare
    return _DTYPES.get(checkpoint_dtype, torch.bfloat16)


def rope_length(config: EngineConfig, model_config: ModelConfig) -> int:
    """Positions the rotary table covers: max_model_len, else the model's, capped to a
    sliding window (attention over full contexts is exact only within it)."""
    rope_len = config.max_model_len or model_config.max_position_embeddings
    window = model_config.sliding_window
    if window is not None and rope_len > window:
        if config.max_model_len is not None:
            raise ValueError(
                f"max_model_len {config.max_model_len} exceeds the model's sliding window "
                f"({window}); fleetlm attends over full contexts, exact only within it"
            )
        rope_len = window
    return rope_len


def build_runner(
    config: EngineConfig,
    model_config: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    tp: TensorParallel = SINGLE,
) -> ModelRunner:
    checkpoint = None if str(config.model) in PRESETS else Path(config.model)
    rope_len = rope_length(config, model_config)
    runner = ModelRunner(config, model_config, device, dtype, rope_len, checkpoint, tp)
    # Without an explicit limit, a request must fit the pool on its own.
    block_size = config.block_size
    runner.max_model_len = config.max_model_len or min(rope_len, runner.num_blocks * block_size)
    if device.type == "cuda" and config.use_cuda_graphs:
        runner.capture_graphs(config.max_num_seqs)
    if device.type == "cuda" and config.warm_up_kernels:
        # Every rank runs the same synthetic steps, so their collectives line up.
        runner.warmup_report = warm_up_mixed_steps(runner)
    return runner
