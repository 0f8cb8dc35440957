# Writing the decoded records (metering/records.py): usage_records rows with the prices in force
# applied, worker_busy rows, and the daily rollup refresh.
from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, literal_column, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from metering.models import UsageDaily, UsageRecord, WorkerBusy
from metering.pricing import PriceSet, price_request, prices_in_force

# Serialises rollup refreshes: a refresh that waited sees every row committed before it.
ROLLUP_LOCK = 0x666C6D_726F6C6C  # "flm" "roll"


def apply_prices(session: Session, rows: list[dict[str, Any]]) -> None:
    """The prices in force on each request's UTC day (of created_at) are recorded on its row."""
    cache: dict[tuple[str, date], PriceSet] = {}
    for row in rows:
        day = row["created_at"].date()
        prices = cache.get((row["model"], day))
        if prices is None:
            prices = cache[row["model"], day] = prices_in_force(session, row["model"], day)
        cost = price_request(
            row["prompt_tokens"], row["cached_tokens"], row["completion_tokens"], prices
        )
        row.update(
            price_version=prices.version,
            input_cost_micros=cost.input,
            cached_input_cost_micros=cost.cached_input,
            output_cost_micros=cost.output,
            cost_micros=cost.total,
        )


def insert_usage(session: Session, rows: list[dict[str, Any]]) -> list[str]:
    """INSERT ... ON CONFLICT (request_id) DO NOTHING; returns the request ids newly written."""
    if not rows:
        return []
    stmt = (
        insert(UsageRecord)
        .values(rows)
        .on_conflict_do_nothing(index_elements=[UsageRecord.request_id])
        .returning(UsageRecord.request_id)
    )
    return list(session.scalars(stmt))


def insert_busy(session: Session, rows: list[dict[str, Any]]) -> None:
    if rows:
        stmt = insert(WorkerBusy).values(rows)
        session.execute(stmt.on_conflict_do_nothing(index_elements=["worker_id", "interval_start"]))


def refresh_rollups(session: Session, keys: set[tuple[uuid.UUID, date]]) -> None:
    """Recomputes usage_daily for each (tenant, UTC day) from the raw rows: idempotent."""
    if not keys:
        return
    session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": ROLLUP_LOCK})
    u = UsageRecord
    day = func.date(func.timezone("UTC", u.created_at))
    for tenant_id, d in sorted(keys):
        start = datetime.combine(d, datetime.min.time(), UTC)
        query = (
            select(
                day,
                u.tenant_id,
                u.model,
                u.priority,
                func.count(),
                func.sum(u.prompt_tokens),
                func.sum(u.cached_tokens),
                func.sum(u.completion_tokens),
                func.sum(u.cost_micros),
                literal_column("now()"),
            )
            .where(
                and_(
                    u.tenant_id == tenant_id,
                    u.created_at >= start,
                    u.created_at < start + timedelta(days=1),
                )
            )
            .group_by(day, u.tenant_id, u.model, u.priority)
        )
        cols = [
            "day", "tenant_id", "model", "priority", "requests", "prompt_tokens",
            "cached_tokens", "completion_tokens", "cost_micros", "updated_at",
        ]  # fmt: skip
        stmt = insert(UsageDaily).from_select(cols, query)
        stmt = stmt.on_conflict_do_update(
            index_elements=["day", "tenant_id", "model", "priority"],
            set_={c: stmt.excluded[c] for c in cols[4:]},
        )
        session.execute(stmt)
