# GET /v1/usage: query parameters and the JSON response.
from __future__ import annotations

import re
from datetime import date
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field

from metering.tenants import TENANT_NAME_PATTERN, TENANT_NAME_RULE

ISO_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


def iso_day(value: Any) -> Any:
    """A day as the document's `format: date` says (YYYY-MM-DD): not pydantic's other readings
    (a Unix time such as 0.0, a datetime)."""
    if isinstance(value, str) and not ISO_DAY.fullmatch(value):
        raise ValueError("a day is written YYYY-MM-DD")
    return value


Day = Annotated[date, BeforeValidator(iso_day)]


class UsageQuery(BaseModel):
    start: Day | None = None  # UTC day, inclusive; default: the first of this month
    end: Day | None = None  # UTC day, exclusive; default: tomorrow
    group_by: Literal["day", "model", "priority"] = "day"
    format: Literal["json", "csv"] = "json"
    tenant: str | None = Field(
        None,
        pattern=TENANT_NAME_PATTERN,
        description=f"Admin keys only: another tenant's name ({TENANT_NAME_RULE}).",
    )


class UsageResponse(BaseModel):
    object: Literal["usage"] = "usage"
    tenant: str
    start: date
    end: date
    group_by: str
    data: list[dict]  # metering.reports.usage_lines: the group keys, then the sums
    total_requests: int
    total_cost_micros: int
