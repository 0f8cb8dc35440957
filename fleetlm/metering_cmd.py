# `fleetlm metering`: the metering writer (fleetlm:metering → Postgres usage_records), against
# the configured Redis and Postgres or a running `fleetlm serve`'s embedded ones (--data-dir).
from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("metering", help="run the metering writer (usage records → Postgres)")
    p.add_argument("--data-dir", type=Path, default=None, help="a running `fleetlm serve`'s")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from service.embedded import resolve_urls
    from service.logging_setup import configure_logging
    from service.metering_writer import MeteringWriter
    from service.settings import Settings

    settings = Settings()
    configure_logging("metering", settings.log_format, settings.log_level)
    redis_url, database_url = resolve_urls(settings, args.data_dir)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    writer = MeteringWriter(
        redis_url,
        database_url,
        batch_size=settings.metering_batch_size,
        claim_idle_ms=int(settings.metering_claim_idle_s * 1000),
        retain_s=settings.metering_retain_s,
        redis_timeout_s=settings.redis_timeout_s,
    )
    try:
        writer.run(stop, retry_s=settings.metering_retry_s)
        writer.flush(timeout_s=5.0)
    finally:
        writer.close()
    return 0
