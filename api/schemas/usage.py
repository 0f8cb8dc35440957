# GET /v1/usage: query parameters and the JSON response.
from __future__ import annotations

from datetime import date
from typing import Literal

from pydantic import BaseModel, Field


class UsageQuery(BaseModel):
    start: date | None = None  # UTC day, inclusive; default: the first of this month
    end: date | None = None  # UTC day, exclusive; default: tomorrow
    group_by: Literal["day", "model", "priority"] = "day"
    format: Literal["json", "csv"] = "json"
    tenant: str | None = Field(None, description="admin keys only: a tenant name")


class UsageResponse(BaseModel):
    object: Literal["usage"] = "usage"
    tenant: str
    start: date
    end: date
    group_by: str
    data: list[dict]  # metering.reports.usage_lines: the group keys, then the sums
    total_requests: int
    total_cost_micros: int
