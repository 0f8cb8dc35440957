# Files and batch jobs (the OpenAI Files and Batches API). File bytes live in Postgres (bytea):
# one durable store that the API and every Celery worker already reach, backed up and
# tenant-isolated with the rest, and written in the same transaction as the batch that produced it.
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    func,
)
from sqlalchemy.orm import Mapped, mapped_column

from metering.models import Base


class StoredFile(Base):
    __tablename__ = "files"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # "file-<hex>"
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"), index=True)
    purpose: Mapped[str] = mapped_column(String(32))  # batch | batch_output
    filename: Mapped[str] = mapped_column(String(500))
    bytes: Mapped[int] = mapped_column(BigInteger)
    content: Mapped[bytes] = mapped_column(LargeBinary, deferred=True)  # listings skip it
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    deleted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Batch(Base):
    __tablename__ = "batches"
    __table_args__ = (Index("ix_batches_tenant_id_created_at", "tenant_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # "batch_<hex>"
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"))
    key_id: Mapped[uuid.UUID] = mapped_column()  # whose limits and metering key the lines use
    endpoint: Mapped[str] = mapped_column(String(64))
    input_file_id: Mapped[str] = mapped_column(String(64))
    completion_window: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), index=True)
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON)
    errors: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)  # why the batch failed
    output_file_id: Mapped[str | None] = mapped_column(String(64))
    error_file_id: Mapped[str | None] = mapped_column(String(64))
    total: Mapped[int] = mapped_column(Integer, server_default="0")
    completed: Mapped[int] = mapped_column(Integer, server_default="0")
    failed: Mapped[int] = mapped_column(Integer, server_default="0")
    input_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")
    cached_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")
    output_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")
    expiring: Mapped[bool] = mapped_column(Boolean, server_default="false")  # window passed
    # The one live pump chain: a task whose token differs exits (the sweep re-arms dead chains).
    pump_token: Mapped[str | None] = mapped_column(String(32))
    pumped_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    in_progress_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finalizing_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    failed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    expired_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    cancelling_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    cancelled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class BatchRequest(Base):
    """One input line. state: pending → queued (on the batch stream) → done | failed; or
    dropped (cancelled/expired before it ran). Results stay here until the output files."""

    __tablename__ = "batch_requests"
    __table_args__ = (Index("ix_batch_requests_batch_id_state", "batch_id", "state"),)

    batch_id: Mapped[str] = mapped_column(ForeignKey("batches.id"), primary_key=True)
    line_no: Mapped[int] = mapped_column(Integer, primary_key=True)
    custom_id: Mapped[str] = mapped_column(String(500))
    request_id: Mapped[str] = mapped_column(String(100), unique=True)
    body: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16), server_default="pending")
    entry_id: Mapped[str | None] = mapped_column(String(32))  # its fleetlm:q:batch entry
    status_code: Mapped[int | None] = mapped_column(Integer)
    response: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # the response body
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # {code, message}: never ran
    prompt_tokens: Mapped[int] = mapped_column(Integer, server_default="0")
    cached_tokens: Mapped[int] = mapped_column(Integer, server_default="0")
    completion_tokens: Mapped[int] = mapped_column(Integer, server_default="0")
    note: Mapped[str | None] = mapped_column(Text)
