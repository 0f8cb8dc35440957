# The metering tests on the embedded Redis + PostgreSQL (tests/conftest.py's `services`): clean
# tables per test, and an in-process writer driven one step at a time.
from __future__ import annotations

import uuid

import pytest
import redis
from sqlalchemy import text

from metering.db import make_engine, make_sessionmaker, transaction
from metering.records import METERING_STREAM
from metering.tenants import create_tenant
from service.metering_writer import GROUP, MeteringWriter


@pytest.fixture
def db(services):
    engine = make_engine(services.database_url)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture
def clean(services, db):
    """Each test starts with an empty stream and empty usage tables."""
    r = redis.Redis.from_url(services.redis_url, decode_responses=True)
    r.delete(METERING_STREAM, f"{METERING_STREAM}:dead")
    with transaction(db) as s:
        s.execute(text("TRUNCATE usage_records, usage_daily, worker_busy, prices"))
    yield r
    r.close()


@pytest.fixture
def writer(services, clean):
    w = MeteringWriter(services.redis_url, services.database_url, consumer="w1", claim_idle_ms=200)
    w.ensure_group()
    yield w
    w.close()


@pytest.fixture
def tenant_id(db) -> uuid.UUID:
    with transaction(db) as s:
        tenant, _ = create_tenant(s, f"t-{uuid.uuid4().hex[:8]}")
        return tenant.id


def drain(w: MeteringWriter, max_steps: int = 50) -> None:
    for _ in range(max_steps):
        if w.step() == 0:
            return
    raise AssertionError("the writer did not drain the stream")


__all__ = ["GROUP", "drain"]
