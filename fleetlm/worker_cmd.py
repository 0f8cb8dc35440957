# `fleetlm worker`: one GPU worker process (engine ↔ Redis queues) against the configured Redis,
# or the embedded one of a running `fleetlm serve` (--data-dir).
from __future__ import annotations

import argparse
import signal
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("worker", help="run one GPU worker (engine step loop on the Redis queues)")
    p.add_argument("--data-dir", type=Path, default=None, help="a running `fleetlm serve`'s")
    p.add_argument("--model", default=None, help="HF checkpoint directory or preset name")
    p.add_argument("--device", default=None, help="auto, cpu, cuda, cuda:N")
    p.add_argument("--worker-id", default=None)
    add_engine_flags(p)
    p.set_defaults(func=run)


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    """FP8 and tensor parallelism (FLEETLM_QUANTIZATION, FLEETLM_KV_CACHE_DTYPE,
    FLEETLM_TENSOR_PARALLEL_SIZE), shared with `fleetlm serve`."""
    p.add_argument("--quantization", choices=("fp8",), default=None, help="FP8 weights")
    p.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default=None)
    p.add_argument("--tensor-parallel-size", type=int, default=None,
                   help="GPUs per worker (one process each; default 1)")  # fmt: skip


def engine_flag_values(args: argparse.Namespace) -> dict:
    names = ("quantization", "kv_cache_dtype", "tensor_parallel_size")
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def run(args: argparse.Namespace) -> int:
    from service.embedded import resolve_urls
    from service.logging_setup import configure_logging
    from service.settings import Settings

    overrides = {k: v for k, v in (("model", args.model), ("device", args.device)) if v}
    settings = Settings(**overrides | engine_flag_values(args))
    configure_logging("worker", settings.log_format, settings.log_level)
    redis_url = settings.redis_url or resolve_urls(settings, args.data_dir)[0]

    from workers.gpu.worker import GpuWorker

    worker = GpuWorker(settings, redis_url, args.worker_id)

    def on_signal(*_: object) -> None:  # the first drains, a second one stops now
        (worker.stopping if worker.draining.is_set() else worker.draining).set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        worker.run()
    finally:
        worker.engine.shutdown()  # a tensor-parallel group's other ranks stop with it
    return 0
