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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from service.embedded import resolve_urls
    from service.logging_setup import configure_logging
    from service.settings import Settings

    overrides = {k: v for k, v in (("model", args.model), ("device", args.device)) if v}
    settings = Settings(**overrides)
    configure_logging("worker", settings.log_format, settings.log_level)
    redis_url = settings.redis_url or resolve_urls(settings, args.data_dir)[0]

    from workers.gpu_worker import GpuWorker

    worker = GpuWorker(settings, redis_url, args.worker_id)

    def on_signal(*_: object) -> None:  # the first drains, a second one stops now
        (worker.stopping if worker.draining.is_set() else worker.draining).set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    worker.run()
    return 0
