# `fleetlm celery worker` / `fleetlm celery beat`: the batch control plane (service/celery_app.py)
# against the configured Redis and Postgres, or a running `fleetlm serve`'s (--data-dir). It logs
# through service/logging_setup.py like every other fleetlm process (FLEETLM_LOG_FORMAT/LEVEL),
# with Celery's per-task lines at DEBUG and no start-up banner.
from __future__ import annotations

import argparse
import os
import warnings
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

    from celery.exceptions import SecurityWarning
    from celery.signals import setup_logging

    from service.celery_app import app, configure
    from service.logging_setup import configure_logging

    @setup_logging.connect  # a receiver replaces Celery's own logging set-up
    def _logging(**_: object) -> None:
        configure_logging(f"celery-{args.role}", settings.log_format, settings.log_level)

    if os.geteuid() == 0:
        # Celery warns whenever it runs as root, for fear of pickled messages running code as
        # root; this app accepts JSON only (service/celery_app.py), so the warning has nothing to
        # prevent. Root is `fleetlm serve` in a container; the images run as an unprivileged user.
        warnings.filterwarnings("ignore", ".*superuser privileges", SecurityWarning)
    configure(settings, redis_url)
    argv = ["--quiet", args.role, "--loglevel", settings.log_level.upper()]
    if args.role == "worker":
        from workers.batch import tasks as batch_tasks  # registers the tasks on the app

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
