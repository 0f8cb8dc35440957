# GET /v1/usage: query parameters and the JSON response.
from __future__ import annotations

from datetime import date
from typing import Literal

from pydantic import BaseModel, Field

from metering.tenants import TENANT_NAME_PATTERN, TENANT_NAME_RULE


class UsageQuery(BaseModel):
    start: date | None = None  # UTC day, inclusive; default: the first of this month
    end: date | None = None  # UTC day, exclusive; default: tomorrow
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
