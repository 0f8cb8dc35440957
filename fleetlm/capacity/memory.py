# Where a replica's memory goes: weights, a reserve we never hand to the KV cache, and the KV
# pool, which is what decides how many conversations can be in flight at once.
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from fleetlm.capacity.deployment import Deployment
from fleetlm.capacity.workloads import Workload


class DoesNotFit(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Reserve:
    """Memory held back on every GPU before the KV pool is sized.

    Two parts, because they fail differently: a fraction of the card (the engine's
    memory-utilisation knob; fragmentation and allocator slack grow with the card), and a
    fixed amount for the CUDA context, NCCL buffers, CUDA graphs and the activations of the
    largest batch, which do not.
    """

    memory_utilisation: float = 0.90
    runtime_bytes_per_gpu: float = 3e9

    def __post_init__(self) -> None:
        if not 0.0 < self.memory_utilisation <= 1.0:
            raise ValueError("memory_utilisation must be in (0, 1]")
        if self.runtime_bytes_per_gpu < 0:
            raise ValueError("runtime reserve cannot be negative")

    def per_gpu_bytes(self, gpu_memory_bytes: float) -> float:
        return gpu_memory_bytes * (1.0 - self.memory_utilisation) + self.runtime_bytes_per_gpu

    def describe(self) -> str:
        return (
            f"{1 - self.memory_utilisation:.0%} of each GPU + "
            f"{self.runtime_bytes_per_gpu / 1e9:g} GB per GPU for runtime and activations"
        )


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    total_bytes: float
    weight_bytes: float
    weight_bytes_per_gpu: float
    reserve_bytes: float
    kv_pool_bytes: float
    kv_bytes_per_token: int
    kv_replication: int
    kv_tokens: int
    mean_context_tokens: int
    conversations: int  # each holding the workload's mean context
    conversations_prefix_shared: int  # upper bound: shared prefixes stored once
    longest_context_tokens: int
    longest_context_bytes: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def memory_plan(dep: Deployment, workload: Workload, reserve: Reserve | None = None) -> MemoryPlan:
    reserve = reserve or Reserve()
    per_gpu_reserve = reserve.per_gpu_bytes(dep.gpu.memory_bytes)
    weights_per_gpu = dep.weight_bytes / dep.num_gpus  # tensor parallel shards every matrix
    kv_per_gpu = dep.gpu.memory_bytes - per_gpu_reserve - weights_per_gpu
    if kv_per_gpu <= 0:
        raise DoesNotFit(
            f"{dep.describe()}: {weights_per_gpu / 1e9:.1f} GB of weights per GPU plus a "
            f"{per_gpu_reserve / 1e9:.1f} GB reserve exceed {dep.gpu.memory_bytes / 1e9:.0f} GB; "
            "add GPUs or quantise the weights"
        )
    kv_pool = kv_per_gpu * dep.num_gpus
    kv_tok = dep.kv_bytes_per_token
    tokens = int(kv_pool // kv_tok)
    ctx = workload.mean_context_tokens
    # With prefix caching a conversation only owns the blocks nobody else has. Counting the
    # shared prefixes as free is the optimistic end: it holds when a few system prompts are
    # shared by everyone, not when each conversation shares with exactly one other.
    unique = max(1.0, ctx - workload.cached_input_tokens)
    return MemoryPlan(
        total_bytes=dep.memory_bytes,
        weight_bytes=dep.weight_bytes,
        weight_bytes_per_gpu=weights_per_gpu,
        reserve_bytes=per_gpu_reserve * dep.num_gpus,
        kv_pool_bytes=kv_pool,
        kv_bytes_per_token=kv_tok,
        kv_replication=dep.kv_replication,
        kv_tokens=tokens,
        mean_context_tokens=ctx,
        conversations=tokens // ctx,
        conversations_prefix_shared=int(tokens // unique),
        longest_context_tokens=workload.max_context_tokens,
        longest_context_bytes=workload.max_context_tokens * kv_tok,
    )
