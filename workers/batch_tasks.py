# Celery tasks for batch jobs: thin, idempotent, they take ids; the work is workers/batch_runner.
from __future__ import annotations

import os
from functools import lru_cache

from service.celery_app import app


@lru_cache(maxsize=1)
def runner():
    from metering.db import make_engine, make_sessionmaker
    from service.settings import get_settings
    from workers.batch_runner import Runner

    settings = get_settings()
    sessions = make_sessionmaker(make_engine(os.environ["DATABASE_URL"]))
    return Runner(settings, sessions, os.environ["REDIS_URL"])


@app.task(name="fleetlm.batches.advance")
def advance(batch_id: str, token: str) -> None:
    """One pump of the batch; re-schedules itself while the batch is active."""
    r = runner()
    if r.pump(batch_id, token):
        advance.apply_async((batch_id, token), countdown=r.settings.batch_pump_interval_s)


@app.task(name="fleetlm.batches.sweep")
def sweep() -> None:
    """Beat: re-arms silent pumps (which also notice expired windows)."""
    for batch_id, token in runner().sweep():
        advance.delay(batch_id, token)
