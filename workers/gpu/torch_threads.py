# How many intra-op threads a worker gives torch. A GPU worker's host work is one Python thread;
# torch's intra-op pool (a thread per core) only competes with it and with the processes beside it
# (on the H200 it made batch packing 0.4 → 1.2 ms mean and 0.6 → 5.7 ms p95 per step,
# docs/benchmarks-log.md), so it gets one. A CPU worker's forward pass uses the pool, but torch's
# default, one thread per physical core, assumes the cores are the worker's alone: beside any
# other busy process (the API under load, a benchmark client, a second worker) one of its threads
# shares a core, every parallel region waits for that thread, and a step becomes many times
# slower (docs/serving.md#cpu-workers has the measurements). So a CPU worker leaves one core to
# what runs beside it and the CPU workers of one machine split the rest, at least one thread each.
# FLEETLM_TORCH_THREADS overrides both. Torch-free at import: `fleetlm serve` uses it to choose
# before it starts the workers.
from __future__ import annotations

import math
import os
from pathlib import Path

RESERVED_CORES = 1  # for the API, Redis, Postgres, a client: whatever runs beside the workers


def _physical_cores(cpus: set[int]) -> int:
    """Distinct (package, core) pairs among these logical CPUs; SMT siblings count once."""
    cores = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            package = (topology / "physical_package_id").read_text().strip()
            core = (topology / "core_id").read_text().strip()
        except OSError:
            return len(cpus)
        cores.add((package, core))
    return len(cores) or len(cpus)


def _cgroup_quota() -> float | None:
    """CPUs a cgroup v2 quota allows (a container's --cpus), None without one."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def usable_cores() -> int:
    """Physical cores this process may run on, capped by a cgroup CPU quota."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:  # not Linux
        cpus = set(range(os.cpu_count() or 1))
    cores = _physical_cores(cpus)
    quota = _cgroup_quota()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return cores


def cpu_worker_threads(num_cpu_workers: int = 1, cores: int | None = None) -> int:
    cores = usable_cores() if cores is None else cores
    return max(1, (cores - RESERVED_CORES) // max(1, num_cpu_workers))


def apply_torch_threads(device: str, torch_threads: int | None) -> int:
    """In a worker, before its engine is built: FLEETLM_TORCH_THREADS when set, else one on a
    GPU worker and the choice above on a CPU worker (a standalone `fleetlm worker` counts as its
    machine's one CPU worker). Returns the count set."""
    import torch

    on_gpu = device != "cpu" and torch.cuda.is_available()
    threads = torch_threads or (1 if on_gpu else cpu_worker_threads())
    torch.set_num_threads(threads)
    return threads
