# The paged KV pool: how many blocks fit, and the one tensor that holds them all.
#   kv_caches: [num_layers, 2 (K, V), num_blocks, block_size, num_kv_heads, head_dim]
# in the model dtype or e4m3 (kv_cache_dtype="fp8": one byte an element, so the same budget
# holds twice the blocks of bf16); num_kv_heads is this tensor-parallel rank's.
from __future__ import annotations

import torch

from engine.config import EngineConfig
from engine.models.config import ModelConfig


def bytes_per_block(model: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    element = torch.empty((), dtype=dtype).element_size()
    return model.kv_bytes_per_token(element) * block_size


def num_blocks_from_budget(
    config: EngineConfig,
    model: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    activation_peak_bytes: int = 0,
    extra_bytes_per_block: int = 0,
) -> int:
    """Explicit `num_kv_blocks`, else a memory budget: on CUDA the configured fraction of the
    card minus everything already in use (weights, other processes) and the measured activation
    peak of a full-budget step; on the CPU a fixed byte budget."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    # A draft model's own cache (speculative decoding) has a block for every target block.
    per_block = bytes_per_block(model, config.block_size, dtype) + extra_bytes_per_block
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = int(total * config.gpu_memory_utilization) - (total - free) - activation_peak_bytes
    else:
        budget = config.cpu_kv_cache_bytes
    num_blocks = budget // per_block
    if num_blocks < 1:
        raise RuntimeError(
            f"no memory left for the KV cache: budget {budget / 2**30:.2f} GiB, "
            f"{per_block / 2**20:.2f} MiB per block; lower max_num_batched_tokens or raise "
            "gpu_memory_utilization"
        )
    return int(num_blocks)


def allocate_kv_caches(
    model: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    shape = (model.num_layers, 2, num_blocks, block_size, model.num_kv_heads, model.head_dim)
    # Zeroed so padding rows of a captured graph never read NaN garbage.
    return torch.zeros(shape, dtype=dtype, device=device)


def profile_lengths(
    max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int
) -> list[int]:
    """Sequence lengths of the worst prefill step the memory profile runs: the full token
    budget (or as much as max_num_seqs sequences of max_model_len can hold), spread as evenly
    as possible over as few sequences as the length cap allows (longer sequences make the
    attention working set larger than many short ones)."""
    num_tokens = min(max_num_batched_tokens, max_num_seqs * max_model_len)
    num_seqs = -(-num_tokens // max_model_len)
    per_seq, extra = divmod(num_tokens, num_seqs)
    return [per_seq + (i < extra) for i in range(num_seqs)]
