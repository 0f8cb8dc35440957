# `fleetlm api`: the OpenAI-compatible HTTP API (uvicorn) against the configured Redis and
# Postgres, or the embedded ones of a running `fleetlm serve` (--data-dir).
from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("api", help="run the OpenAI-compatible HTTP API")
    p.add_argument("--data-dir", type=Path, default=None, help="a running `fleetlm serve`'s")
    p.add_argument("--model", default=None, help="HF checkpoint directory or preset name")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=None)
    # `fleetlm serve` binds the ports once and passes the sockets to each API process.
    p.add_argument("--listen-fds", default="", help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import socket

    from api.main import create_app
    from api.server import serve
    from service.embedded import resolve_urls
    from service.logging_setup import configure_logging
    from service.settings import Settings

    overrides = {
        k: v for k, v in (("model", args.model), ("host", args.host), ("port", args.port)) if v
    }
    settings = Settings(**overrides)
    configure_logging("api", settings.log_format, settings.log_level)
    redis_url, database_url = resolve_urls(settings, args.data_dir)
    fds = [int(fd) for fd in args.listen_fds.split(",") if fd]
    sockets = [socket.socket(fileno=fd) for fd in fds] or None
    serve(create_app(settings, redis_url, database_url), settings, sockets)
    return 0
