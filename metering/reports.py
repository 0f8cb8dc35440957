# Finance queries over the raw usage rows: invoice lines grouped by day, model, priority and/or
# tenant, with the per-kind costs recorded on each row summed (so totals match the raw rows).
from __future__ import annotations

import csv
import io
import uuid
from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from metering.models import Tenant, UsageRecord
from metering.pricing import format_micros

GROUPS = ("day", "model", "priority", "tenant")
METRICS = (
    "requests", "prompt_tokens", "cached_tokens", "completion_tokens",
    "input_cost_micros", "cached_input_cost_micros", "output_cost_micros", "cost_micros",
)  # fmt: skip


def _midnight(d: date) -> datetime:
    return datetime.combine(d, datetime.min.time(), UTC)


def usage_lines(
    session: Session,
    *,
    start: date,
    end: date,
    group_by: tuple[str, ...] = ("day",),
    tenant_id: uuid.UUID | None = None,
) -> list[dict[str, Any]]:
    """Lines for requests enqueued in [start, end) (UTC days); tenant_id None: all tenants."""
    u = UsageRecord
    columns = {
        "day": func.date(func.timezone("UTC", u.created_at)).label("day"),
        "model": u.model.label("model"),
        "priority": u.priority.label("priority"),
        "tenant": Tenant.name.label("tenant"),
    }
    keys = [columns[g] for g in group_by]
    query = (
        select(
            *keys,
            func.count().label("requests"),
            *(
                func.coalesce(func.sum(getattr(u, m)), 0).label(m)
                for m in METRICS
                if m != "requests"
            ),
        )
        .join(Tenant, Tenant.id == u.tenant_id)
        .where(u.created_at >= _midnight(start), u.created_at < _midnight(end))
    )
    if tenant_id is not None:
        query = query.where(u.tenant_id == tenant_id)
    if keys:
        query = query.group_by(*keys).order_by(*keys)
    lines = []
    for row in session.execute(query).mappings():
        line = {g: (row[g].isoformat() if g == "day" else row[g]) for g in group_by}
        line.update({m: int(row[m]) for m in METRICS})
        line["cost"] = format_micros(line["cost_micros"])
        lines.append(line)
    return lines


# A spreadsheet runs a cell that starts with one of these as a formula (CSV injection); model
# names and other text cells come from configuration and users, so such a cell gets a leading '.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def neutralised(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


def to_csv(lines: list[dict[str, Any]], group_by: tuple[str, ...]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[*group_by, *METRICS, "cost"], lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: neutralised(v) for k, v in line.items()} for line in lines)
    return out.getvalue()
