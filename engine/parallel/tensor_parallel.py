# Tensor parallelism: one process per rank (rank r on cuda:r, or all on the CPU), joined by
# torch.distributed. Two groups:
#   device group  NCCL on GPUs (gloo on the CPU): the model's all-reduces and the logits gather,
#                 launched on the current stream, so CUDA graphs capture them with the step;
#   CPU group     gloo: the step broadcast (rank 0's scheduler → every rank, one object per
#                 step) and start-up agreements (the KV pool size).
# With one rank every collective is a no-op and nothing is initialised (SINGLE).
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

# Followers block in the step broadcast while the server is idle; that wait must never time
# out (a dead peer is found by the process watchdogs in tp_followers.py instead).
IDLE_TIMEOUT = timedelta(days=365)


@dataclass(frozen=True, slots=True)
class TensorParallel:
    rank: int = 0
    size: int = 1
    device_group: Any = None
    cpu_group: Any = None

    # -- which slice this rank holds -----------------------------------------------------

    def split(self, total: int, what: str) -> tuple[int, int]:
        """(start, length) of this rank's even share of `total` rows/columns/heads."""
        if total % self.size:
            raise ValueError(
                f"{what} ({total}) is not divisible by tensor_parallel_size ({self.size})"
            )
        n = total // self.size
        return self.rank * n, n

    def kv_heads(self, num_kv_heads: int) -> tuple[int, int]:
        """(first KV head, count) on this rank. With more ranks than KV heads each head is
        copied onto size / num_kv_heads ranks (every rank holds one)."""
        if num_kv_heads >= self.size:
            return self.split(num_kv_heads, "num_key_value_heads")
        if self.size % num_kv_heads:
            raise ValueError(
                f"tensor_parallel_size ({self.size}) must divide or be a multiple of "
                f"num_key_value_heads ({num_kv_heads})"
            )
        return self.rank // (self.size // num_kv_heads), 1

    # -- collectives ---------------------------------------------------------------------

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place (row-parallel outputs, the vocab-parallel embedding)."""
        if self.size > 1:
            import torch.distributed as dist

            dist.all_reduce(x, group=self.device_group)
        return x

    def gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """x: [rows, n] on every rank → [rows, size * n], rank r's block at columns r*n..."""
        if self.size == 1:
            return x
        import torch.distributed as dist

        rows, n = x.shape
        out = torch.empty((self.size * rows, n), dtype=x.dtype, device=x.device)
        # all_gather_single (torch >= 2.13) is all_gather_into_tensor's new name
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(out, x.contiguous(), group=self.device_group)
        # [size * rows, n] (rank blocks stacked) → [rows, size * n]
        return out.view(self.size, rows, n).movedim(0, 1).reshape(rows, self.size * n)

    def min_int(self, n: int) -> int:
        """The smallest of every rank's n (each rank sizes its own KV pool; all must agree)."""
        if self.size == 1:
            return n
        import torch.distributed as dist

        t = torch.tensor([n], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return int(t.item())

    def broadcast(self, obj: Any = None) -> Any:
        """Rank 0's `obj` on every rank (pickled; two gloo messages: length, then bytes)."""
        if self.size == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.cpu_group)
        return box[0]

    def close(self) -> None:
        if self.size > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


SINGLE = TensorParallel()


def init_tensor_parallel(rank: int, size: int, device: torch.device, port: int) -> TensorParallel:
    """Join the group of `size` processes meeting at 127.0.0.1:port (rank 0 hosts the store)."""
    import torch.distributed as dist

    if size == 1:
        return SINGLE
    if dist.is_initialized():
        raise RuntimeError(
            "this process already belongs to a torch.distributed group; "
            "one tensor-parallel engine per process"
        )
    # NVLink multicast (NVLS) stays off: on shared hosts it can take the GPUs out of service.
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    init = f"tcp://127.0.0.1:{port}"
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group(
            "nccl", init_method=init, rank=rank, world_size=size, device_id=device
        )
        cpu_group = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    else:
        dist.init_process_group(
            "gloo", init_method=init, rank=rank, world_size=size, timeout=IDLE_TIMEOUT
        )
        cpu_group = dist.group.WORLD
    tp = TensorParallel(rank, size, dist.group.WORLD, cpu_group)
    # One collective on each group now, so communicators exist before any graph capture.
    tp.all_reduce(torch.zeros(1, device=device))
    tp.min_int(0)
    return tp
