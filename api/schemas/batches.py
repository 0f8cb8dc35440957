# OpenAI batch objects.
from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from api.schemas.pages import ListPage
from metering.batch_models import Batch
from service.schemas.fields import Metadata, checked


class CreateBatch(BaseModel):
    model_config = ConfigDict(strict=True)

    input_file_id: str = checked(
        "A batch file this tenant uploaded.",
        ...,
        min_length=1,
        max_length=64,
        description="A file uploaded with purpose batch.",
    )
    endpoint: Literal["/v1/chat/completions", "/v1/completions"]
    completion_window: str = Field(
        "24h", max_length=16, description="One of the server's batch_completion_windows."
    )
    metadata: Metadata | None = None


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[dict[str, Any]]


TIMESTAMPS = (
    "in_progress", "expires", "finalizing", "completed", "failed", "expired", "cancelling",
    "cancelled",
)  # fmt: skip


def _ts(t: datetime | None) -> int | None:
    return None if t is None else int(t.timestamp())


class BatchObject(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: str
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    usage: dict[str, Any]
    metadata: dict[str, str] | None

    @classmethod
    def of(cls, b: Batch) -> BatchObject:
        return cls(
            id=b.id,
            endpoint=b.endpoint,
            errors=BatchErrors(data=b.errors) if b.errors else None,
            input_file_id=b.input_file_id,
            completion_window=b.completion_window,
            status=b.status,
            output_file_id=b.output_file_id,
            error_file_id=b.error_file_id,
            created_at=int(b.created_at.timestamp()),
            **{f"{name}_at": _ts(getattr(b, f"{name}_at")) for name in TIMESTAMPS},
            request_counts=RequestCounts(total=b.total, completed=b.completed, failed=b.failed),
            usage={
                "input_tokens": b.input_tokens,
                "input_tokens_details": {"cached_tokens": b.cached_tokens},
                "output_tokens": b.output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": b.input_tokens + b.output_tokens,
            },
            metadata=b.metadata_,
        )


class BatchList(ListPage):
    data: list[BatchObject]
