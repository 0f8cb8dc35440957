# Shared by the admin subcommands (tenants, prices, usage): the database URL from DATABASE_URL
# or a running `fleetlm serve`'s services.json (--data-dir), and one transaction per command.
from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy.orm import Session


def add_data_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", type=Path, default=None, help="a running `fleetlm serve`'s")


def database_url(args: argparse.Namespace) -> str:
    from service.embedded import resolve_urls
    from service.settings import Settings

    settings = Settings()
    if settings.database_url:
        return settings.database_url
    return resolve_urls(settings, getattr(args, "data_dir", None))[1]


@contextmanager
def session_for(args: argparse.Namespace) -> Iterator[Session]:
    """The command's unit of work: commits on success, rolls back on error."""
    from metering.db import make_engine, make_sessionmaker, transaction

    engine = make_engine(database_url(args))
    try:
        with transaction(make_sessionmaker(engine)) as session:
            yield session
    finally:
        engine.dispose()
