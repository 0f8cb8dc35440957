# Real embedded Redis + PostgreSQL for the metering tests, the schema built by the migrations,
# and an in-process writer driven one step at a time.
from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
import redis
from sqlalchemy import text

from fleetlm.migrate_cmd import upgrade
from metering.db import make_engine, make_sessionmaker, transaction
from metering.records import METERING_STREAM
from metering.tenants import create_tenant
from metering.writer import GROUP, MeteringWriter
from service.embedded import EmbeddedServices


@pytest.fixture(scope="package")
def services():
    # Not under pytest's basetemp: any concurrent pytest session chmods /tmp/pytest-of-<user>
    # to 0700, which locks out the unprivileged user pgserver runs Postgres as (when root).
    root = Path(tempfile.mkdtemp(prefix="fleetlm-metering-"))
    svc = EmbeddedServices(root / "data")
    svc.start(redis=True, postgres=True)
    try:
        upgrade(svc.database_url)
        yield svc
    finally:
        svc.stop()
        shutil.rmtree(root, ignore_errors=True)


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
