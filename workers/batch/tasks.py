# Celery tasks for batch jobs: thin, idempotent, they take ids; the work is workers/batch/runner.py.
# The Celery worker command binds the settings (with the resolved Redis and Postgres URLs) before
# the worker starts; the runner is built on first use, in the process that runs the tasks.
from __future__ import annotations

from functools import lru_cache

from redis import RedisError
from sqlalchemy.exc import DBAPIError

from metering.db import make_engine, make_sessionmaker
from service.celery_app import ADVANCE_TASK, SWEEP_TASK, app
from service.settings import Settings
from workers.batch.runner import Runner

_bound: dict[str, Settings] = {}


def bind(settings: Settings) -> None:
    if not (settings.redis_url and settings.database_url):
        raise ValueError("the batch tasks need both URLs resolved")
    _bound["settings"] = settings
    runner.cache_clear()


@lru_cache(maxsize=1)
def runner() -> Runner:
    settings = _bound["settings"]
    sessions = make_sessionmaker(make_engine(settings.database_url))
    return Runner(settings, sessions, settings.redis_url)


# Redis or Postgres away: the pump is idempotent, so it is simply run again with back-off (and
# should the retry itself not reach the broker, the beat sweep re-arms the batch).
_RETRY = {
    "autoretry_for": (RedisError, DBAPIError),
    "retry_backoff": 1,
    "retry_backoff_max": 30,
    "max_retries": None,
}


@app.task(name=ADVANCE_TASK, **_RETRY)
def advance(batch_id: str, token: str) -> None:
    """One pump of the batch; re-schedules itself while the batch is active."""
    r = runner()
    if r.pump(batch_id, token):
        advance.apply_async((batch_id, token), countdown=r.settings.batch_pump_interval_s)


@app.task(name=SWEEP_TASK)
def sweep() -> None:
    """Beat: re-arms silent pumps (which also notice expired windows)."""
    for batch_id, token in runner().sweep():
        advance.delay(batch_id, token)
