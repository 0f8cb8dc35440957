# `fleetlm celery worker` / `fleetlm celery beat`: the batch control plane (workers/celery_app.py)
# against the configured Redis and Postgres, or a running `fleetlm serve`'s (--data-dir).
from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("celery", help="run the Celery worker or beat for batch jobs")
    p.add_argument("role", choices=("worker", "beat"))
    p.add_argument("--data-dir", type=Path, default=None, help="a running `fleetlm serve`'s")
    p.add_argument("--concurrency", type=int, default=1, help="worker: tasks at once")
    p.add_argument("--pidfile", type=Path, default=None)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from service.embedded import resolve_urls
    from service.settings import Settings

    settings = Settings()
    redis_url, database_url = resolve_urls(settings, args.data_dir)
    settings = settings.model_copy(update={"redis_url": redis_url, "database_url": database_url})

    from service.celery_app import app, configure

    configure(settings, redis_url)
    argv = [args.role, "--loglevel", "INFO"]
    if args.role == "worker":
        from workers import batch_tasks  # registers the tasks on the app

        batch_tasks.bind(settings)
        # solo: one process, so a kill takes exactly the task it ran (acks_late redelivers it)
        pool = "solo" if args.concurrency == 1 else "prefork"
        argv += ["--pool", pool, "--concurrency", str(args.concurrency), "-Q", "fleetlm"]
    else:
        schedule = (args.data_dir or settings.data_dir) / "celerybeat-schedule"
        argv += ["--schedule", str(schedule)]
    if args.pidfile is not None:
        argv += ["--pidfile", str(args.pidfile)]
    app.start(argv)
    return 0
