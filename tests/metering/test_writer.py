# The metering writer: exactly one row per record under redelivery, nothing lost while Postgres
# is down, dead writers' pending records taken over, acknowledged records trimmed, bad records
# dead-lettered instead of blocking the stream.
from __future__ import annotations

import time

import pytest
from sqlalchemy import func, select

from metering.models import UsageRecord
from metering.records import METERING_STREAM as STREAM
from metering.records import decode_record, encode_record
from service.metering_writer import DEAD_LETTER_STREAM, GROUP, MeteringWriter
from tests.metering.conftest import drain
from tests.metering.records import usage_record

pytestmark = pytest.mark.timeout(120)


def count_rows(db, **where) -> int:
    with db() as s:
        q = select(func.count()).select_from(UsageRecord).filter_by(**where)
        return s.scalar(q)


def test_one_row_per_record_and_redelivery_is_ignored(writer, clean, db, tenant_id):
    records = [usage_record(tenant_id) for _ in range(5)]
    for r in records:
        clean.xadd(STREAM, encode_record(r))
    drain(writer)
    assert count_rows(db, tenant_id=tenant_id) == 5
    for r in records[:3]:  # the same records delivered again
        clean.xadd(STREAM, encode_record(r))
    drain(writer)
    assert count_rows(db, tenant_id=tenant_id) == 5
    assert clean.xpending(STREAM, GROUP)["pending"] == 0
    with db() as s:
        row = s.scalars(select(UsageRecord).filter_by(request_id=records[0].request_id)).one()
    assert (row.prompt_tokens, row.cached_tokens, row.completion_tokens) == (10, 4, 7)
    assert row.ttft_ms == 20.0 and row.batch_id is None and row.error is None


def test_draft_token_counts_are_recorded(writer, clean, db, tenant_id):
    spec = usage_record(tenant_id, spec_proposed_tokens=12, spec_accepted_tokens=9)
    plain = usage_record(tenant_id)
    for r in (spec, plain):
        clean.xadd(STREAM, encode_record(r))
    drain(writer)
    with db() as s:
        rows = {
            r.request_id: (r.spec_proposed_tokens, r.spec_accepted_tokens)
            for r in s.scalars(select(UsageRecord).filter_by(tenant_id=tenant_id))
        }
    assert rows == {spec.request_id: (12, 9), plain.request_id: (0, 0)}


def test_postgres_down_records_wait_in_redis(services, writer, clean, db, tenant_id):
    before = [usage_record(tenant_id) for _ in range(3)]
    for r in before:
        clean.xadd(STREAM, encode_record(r))
    drain(writer)
    services._pg_server.cleanup()  # stop the embedded Postgres (pg_ctl stop)
    try:
        during = [usage_record(tenant_id, status="cancelled", finish_reason="abort")]
        during += [usage_record(tenant_id) for _ in range(4)]
        for r in during:
            clean.xadd(STREAM, encode_record(r))
        with pytest.raises(Exception) as exc:
            writer.step()
        assert (
            "connect" in str(exc.value).lower() or "operational" in type(exc.value).__name__.lower()
        )
        # not acknowledged: the records wait in Redis
        assert clean.xpending(STREAM, GROUP)["pending"] == len(during)
    finally:
        services._start_postgres()
    drain(writer)
    assert count_rows(db, tenant_id=tenant_id) == len(before) + len(during)
    assert count_rows(db, tenant_id=tenant_id, status="cancelled") == 1
    assert clean.xpending(STREAM, GROUP)["pending"] == 0


def test_pending_records_of_a_dead_writer_are_claimed(services, writer, clean, db, tenant_id):
    records = [usage_record(tenant_id) for _ in range(4)]
    for r in records:
        clean.xadd(STREAM, encode_record(r))
    dead = MeteringWriter(services.redis_url, services.database_url, consumer="dead")
    try:
        assert len(dead._read_group(">")) == 4  # read, then "crashed" before writing
    finally:
        dead.close()
    assert writer.step() == 0 or count_rows(db, tenant_id=tenant_id) == 0
    time.sleep(0.3)  # past claim_idle_ms (200 ms)
    writer._last_claim = 0.0
    drain(writer)
    assert count_rows(db, tenant_id=tenant_id) == 4
    assert clean.xpending(STREAM, GROUP)["pending"] == 0


def test_trim_keeps_only_unacknowledged_and_recent(services, writer, clean, db, tenant_id):
    for _ in range(3):
        clean.xadd(STREAM, encode_record(usage_record(tenant_id)))
    drain(writer)
    writer.retain_ms = 0
    clean.xadd(STREAM, encode_record(usage_record(tenant_id)))  # undelivered: must survive the trim
    writer.trim()
    assert clean.xlen(STREAM) == 1
    drain(writer)
    assert count_rows(db, tenant_id=tenant_id) == 4


def test_malformed_and_rejected_records_are_dead_lettered(writer, clean, db, tenant_id):
    import uuid

    good = usage_record(tenant_id)
    clean.xadd(STREAM, {"request_id": "broken"})
    clean.xadd(
        STREAM, encode_record(usage_record(uuid.uuid4()))
    )  # unknown tenant: foreign key violation
    clean.xadd(STREAM, encode_record(good))
    drain(writer)
    assert count_rows(db, tenant_id=tenant_id) == 1
    assert clean.xlen(DEAD_LETTER_STREAM) == 2
    assert clean.xpending(STREAM, GROUP)["pending"] == 0


def test_worker_busy_intervals_are_written_once(writer, clean, db):
    from metering.models import WorkerBusy
    from workers.gpu.usage import BusyMeter

    meter = BusyMeter("w-busy", interval_s=60)
    meter.add(0.25)
    meter.add(0.5)
    record = meter.due(now=meter.start + 61)  # the interval closed
    assert record is not None
    decoded = decode_record(record)
    assert (decoded.busy_ms, decoded.num_steps, decoded.interval_s) == (750, 2, 60)
    assert meter.due(now=meter.start + 1) is None
    clean.xadd(STREAM, record)
    clean.xadd(STREAM, record)  # redelivered
    drain(writer)
    with db() as s:
        rows = s.scalars(select(WorkerBusy).filter_by(worker_id="w-busy")).all()
    assert [(r.busy_ms, r.num_steps, r.interval_s) for r in rows] == [(750, 2, 60)]
