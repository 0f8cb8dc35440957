# Stream records (string fields on fleetlm:metering) → usage_records rows with prices applied,
# and the daily rollup refresh. Worker busy records share the stream (field kind=worker_busy).
from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, literal_column, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from metering.models import UsageDaily, UsageRecord, WorkerBusy
from metering.pricing import PriceSet, price_request, prices_in_force

BUSY_KIND = "worker_busy"
# Serialises rollup refreshes: a refresh that waited sees every row committed before it.
ROLLUP_LOCK = 0x666C6D_726F6C6C  # "flm" "roll"


def _ms(value: str | None) -> float | None:
    return float(value) if value not in (None, "") else None


def _ts(value: str) -> datetime:
    return datetime.fromtimestamp(float(value), UTC)


def usage_row(fields: dict[str, str]) -> dict[str, Any]:
    """Raises ValueError/KeyError for a malformed record (it goes to the dead-letter stream)."""
    key_id = fields.get("key_id") or None
    return {
        "request_id": fields["request_id"],
        "tenant_id": uuid.UUID(fields["tenant_id"]),
        "key_id": uuid.UUID(key_id) if key_id else None,
        "model": fields["model"],
        "priority": fields["priority"],
        "endpoint": fields["endpoint"],
        "batch_id": fields.get("batch_id") or None,
        "status": fields["status"],
        "finish_reason": fields["finish_reason"],
        "error": fields.get("error") or None,
        "prompt_tokens": int(fields["prompt_tokens"]),
        "cached_tokens": int(fields.get("cached_tokens") or 0),
        "completion_tokens": int(fields["completion_tokens"]),
        "preemptions": int(fields.get("preemptions") or 0),
        "spec_proposed_tokens": int(fields.get("spec_proposed_tokens") or 0),
        "spec_accepted_tokens": int(fields.get("spec_accepted_tokens") or 0),
        "queue_ms": _ms(fields.get("queue_ms")),
        "ttft_ms": _ms(fields.get("ttft_ms")),
        "tpot_ms": _ms(fields.get("tpot_ms")),
        "e2e_ms": _ms(fields.get("e2e_ms")),
        "worker_id": fields.get("worker_id") or None,
        "created_at": _ts(fields["enqueued_at"]),
        "finished_at": _ts(fields["finished_at"]),
    }


def busy_row(fields: dict[str, str]) -> dict[str, Any]:
    return {
        "worker_id": fields["worker_id"],
        "interval_start": _ts(fields["interval_start"]),
        "interval_s": int(fields["interval_s"]),
        "busy_ms": int(fields["busy_ms"]),
        "num_steps": int(fields["num_steps"]),
    }


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
