# Workers as tensor-parallel groups. A worker process is rank 0 of its group: it alone speaks to
# Redis (heartbeat, queues, stats, metrics, drain, metering), and its engine starts and stops ranks
# 1..N-1 itself (engine/parallel/tp_followers.py), so a group is one worker everywhere outside the
# engine. `fleetlm serve` gives each group N GPUs through CUDA_VISIBLE_DEVICES; inside a group rank
# r uses the r-th visible GPU.
from __future__ import annotations


def worker_gpu_groups(num_gpus: int, tp_size: int, num_workers: int | None) -> list[list[int]]:
    """The GPUs of each worker: one group per tp_size GPUs by default (at least one worker;
    with no GPU, one CPU worker whose ranks share the CPU). An explicit num_workers beyond the
    GPUs reuses them round-robin, as plain workers always did."""
    if tp_size < 1:
        raise ValueError("tensor_parallel_size must be >= 1")
    if num_gpus == 0:
        return [[] for _ in range(1 if num_workers is None else num_workers)]
    if tp_size > num_gpus:
        raise ValueError(f"tensor_parallel_size {tp_size} needs {tp_size} GPUs; {num_gpus} visible")
    count = num_workers if num_workers is not None else num_gpus // tp_size
    return [[(i * tp_size + r) % num_gpus for r in range(tp_size)] for i in range(count)]


def visible_devices(gpus: list[int]) -> str:
    """CUDA_VISIBLE_DEVICES for a group (its ranks see their GPUs as cuda:0..N-1)."""
    return ",".join(str(g) for g in gpus)
