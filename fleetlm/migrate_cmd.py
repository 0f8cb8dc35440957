# `fleetlm migrate`: apply the Alembic migrations (`alembic upgrade head`) to the configured
# Postgres, or to the embedded one of a running `fleetlm serve` (--data-dir).
from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("migrate", help="apply database migrations (alembic upgrade head)")
    p.add_argument("--data-dir", type=Path, default=None, help="a running `fleetlm serve`'s")
    p.add_argument("--revision", default="head")
    p.set_defaults(func=run)


def alembic_config(database_url: str):
    from alembic.config import Config

    import migrations

    config = Config()
    config.set_main_option("script_location", str(Path(next(iter(migrations.__path__)))))
    # ConfigParser interpolation: a literal % in the URL must be doubled.
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    from alembic import command

    command.upgrade(alembic_config(database_url), revision)


def run(args: argparse.Namespace) -> int:
    from service.embedded import resolve_urls
    from service.settings import Settings

    settings = Settings()
    if settings.database_url:
        database_url = settings.database_url
    else:
        _, database_url = resolve_urls(settings, args.data_dir)
    upgrade(database_url, args.revision)
    print(f"fleetlm migrate: database at {args.revision}")
    return 0
