# GET /v1/usage: query parameters and the JSON response.
from __future__ import annotations

from datetime import date
from typing import Literal

from pydantic import BaseModel, Field


class UsageQuery(BaseModel):
    start: date | None = None  # UTC day, inclusive; default: the first of this month
    end: date | None = None  # UTC day, exclusive; default: tomorrow
    group_by: Literal["day", "model", "class"] = "day"
    format: Literal["json", "csv"] = "json"
    tenant: str | None = Field(None, description="admin keys only: a tenant name")


class UsageLine(BaseModel):
    day: str | None = None
    model: str | None = None
    class_: str | None = Field(None, alias="class")
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    input_cost_micros: int
    cached_input_cost_micros: int
    output_cost_micros: int
    cost_micros: int
    cost: str  # cost_micros in currency units, exact


class UsageResponse(BaseModel):
    object: Literal["usage"] = "usage"
    tenant: str
    start: date
    end: date
    group_by: str
    data: list[dict]
    total_requests: int
    total_cost_micros: int
