# Prices in integer micro-units, the price in force recorded on each row, and daily rollups that
# equal the sums of the raw rows however often they are refreshed.
from __future__ import annotations

import time
from datetime import UTC, date, datetime, timedelta

import pytest
from sqlalchemy import func, select, text

from metering.db import transaction
from metering.models import UsageDaily, UsageRecord
from metering.pricing import (
    PriceSet,
    format_micros,
    price_request,
    prices_in_force,
    set_price,
    to_micros,
    token_cost,
)
from metering.records import METERING_STREAM as STREAM
from metering.records import encode_record
from metering.usage_rows import refresh_rollups
from tests.metering.conftest import drain
from tests.metering.records import usage_record

pytestmark = pytest.mark.timeout(60)


def test_integer_price_arithmetic():
    assert to_micros("0.15") == 150_000 and to_micros("2") == 2_000_000
    with pytest.raises(ValueError):
        to_micros("0.0000001")
    # 1,000,003 tokens at 0.15/Mtok = 150,000.45 micro → 150,000; 3 tokens at 2.5/Mtok = 7.5 → 8
    assert token_cost(1_000_003, 150_000) == 150_000
    assert token_cost(3, 2_500_000) == 8
    assert isinstance(token_cost(10**12, 10**9), int)  # no float on any path
    cost = price_request(1000, 400, 250, PriceSet(date(2025, 1, 1), 1_000_000, 100_000, 4_000_000))
    # 600 uncached × 1.0 = 600 µ; 400 cached × 0.1 = 40 µ; 250 out × 4.0 = 1000 µ
    assert (cost.input, cost.cached_input, cost.output, cost.total) == (600, 40, 1000, 1640)
    assert format_micros(1_234_567) == "1.234567" and format_micros(5) == "0.000005"


def test_price_in_force_is_recorded_on_each_row(writer, clean, db, tenant_id):
    today = datetime.now(UTC).date()
    with transaction(db) as s:
        set_price(s, "*", "input", 1_000_000, today - timedelta(days=30))
        set_price(s, "tiny", "input", 2_000_000, today - timedelta(days=10))
        set_price(s, "tiny", "cached_input", 500_000, today - timedelta(days=10))
        set_price(s, "tiny", "output", 8_000_000, today - timedelta(days=10))
        set_price(s, "tiny", "output", 9_000_000, today + timedelta(days=1))  # not yet
    with db() as s:
        assert prices_in_force(s, "tiny", today).output == 8_000_000
        assert prices_in_force(s, "other", today) == PriceSet(today - timedelta(days=30), 1_000_000)
    rec = usage_record(tenant_id, prompt_tokens=1000, cached_tokens=600, completion_tokens=100)
    clean.xadd(STREAM, encode_record(rec))
    drain(writer)
    with db() as s:
        row = s.scalars(select(UsageRecord).filter_by(request_id=rec.request_id)).one()
    assert row.price_version == today - timedelta(days=10)
    # 400 × 2.0 + 600 × 0.5 + 100 × 8.0 micro-units
    assert (row.input_cost_micros, row.cached_input_cost_micros, row.output_cost_micros) == (
        800,
        300,
        800,
    )
    assert row.cost_micros == 1900


def test_rollups_equal_sums_of_raw_rows(writer, clean, db, tenant_id):
    yesterday = time.time() - 86400
    recs = [usage_record(tenant_id, completion_tokens=i) for i in range(1, 6)]
    recs += [usage_record(tenant_id, model="other", priority="batch") for _ in range(3)]
    recs += [
        usage_record(tenant_id, enqueued_at=yesterday, finished_at=yesterday) for _ in range(2)
    ]
    for r in recs[:4]:
        clean.xadd(STREAM, encode_record(r))
    drain(writer)  # two batches: the rollup of the first is refreshed by the second
    for r in recs[4:] + recs[:2]:  # with redeliveries
        clean.xadd(STREAM, encode_record(r))
    drain(writer)

    with transaction(db) as s:
        day = func.date(func.timezone("UTC", UsageRecord.created_at))
        raw = s.execute(
            select(
                day,
                UsageRecord.model,
                UsageRecord.priority,
                func.count(),
                func.sum(UsageRecord.prompt_tokens),
                func.sum(UsageRecord.cached_tokens),
                func.sum(UsageRecord.completion_tokens),
                func.sum(UsageRecord.cost_micros),
            )
            .where(UsageRecord.tenant_id == tenant_id)
            .group_by(day, UsageRecord.model, UsageRecord.priority)
        ).all()
        rolled = s.execute(
            select(
                UsageDaily.day,
                UsageDaily.model,
                UsageDaily.priority,
                UsageDaily.requests,
                UsageDaily.prompt_tokens,
                UsageDaily.cached_tokens,
                UsageDaily.completion_tokens,
                UsageDaily.cost_micros,
            ).where(UsageDaily.tenant_id == tenant_id)
        ).all()
        assert sorted(map(tuple, raw)) == sorted(map(tuple, rolled))
        assert sum(r[3] for r in rolled) == len(recs)
        assert len(rolled) == 3
        # refreshing again changes nothing (idempotent upsert)
        refresh_rollups(s, {(tenant_id, r[0]) for r in rolled})
        again = s.execute(
            select(UsageDaily.day, UsageDaily.requests).where(UsageDaily.tenant_id == tenant_id)
        ).all()
        assert sorted(again) == sorted((r[0], r[3]) for r in rolled)
        # the finance view bills per priority too (the same requests, by month)
        billed = s.execute(
            text(
                "SELECT priority, sum(requests) FROM v_monthly_bill b JOIN tenants t"
                " ON t.name = b.tenant WHERE t.id = :t GROUP BY priority"
            ),
            {"t": tenant_id},
        ).all()
        assert dict(billed) == {"interactive": 7, "batch": 3}
