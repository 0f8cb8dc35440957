# SQLAlchemy models: tenants and their API keys (hashes only), limits, prices, one usage row per
# request, daily rollups and worker busy time. Money is integer micro-units throughout.
from __future__ import annotations

import uuid
from datetime import date, datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Date,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    Uuid,
    func,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    api_keys: Mapped[list[ApiKey]] = relationship(back_populates="tenant")


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the key
    prefix: Mapped[str] = mapped_column(String(16))  # shown in listings: "flm-ab12cd"
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    is_admin: Mapped[bool] = mapped_column(Boolean, server_default="false")  # admin endpoints

    tenant: Mapped[Tenant] = relationship(back_populates="api_keys")


class TenantLimit(Base):
    """Per tenant and priority; NULL means unlimited. Batch never draws on interactive."""

    __tablename__ = "tenant_limits"
    __table_args__ = (CheckConstraint("priority IN ('interactive', 'batch')", name="priority"),)

    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    priority: Mapped[str] = mapped_column(String(16), primary_key=True)
    max_concurrency: Mapped[int | None] = mapped_column(Integer)
    tokens_per_minute: Mapped[int | None] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), onupdate=func.now()
    )


class Price(Base):
    """Append-only price list: micro-units per million tokens, in force from a UTC day on.
    model '*' is the fallback for models without their own prices."""

    __tablename__ = "prices"
    __table_args__ = (
        UniqueConstraint("model", "token_kind", "effective_from"),
        CheckConstraint("token_kind IN ('input', 'cached_input', 'output')", name="token_kind"),
        CheckConstraint("micros_per_mtok >= 0", name="non_negative"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    model: Mapped[str] = mapped_column(String(200))
    token_kind: Mapped[str] = mapped_column(String(16))
    micros_per_mtok: Mapped[int] = mapped_column(BigInteger)
    effective_from: Mapped[date] = mapped_column(Date)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class UsageRecord(Base):
    """Exactly one row per admitted request (request_id unique; the writer inserts with
    ON CONFLICT DO NOTHING). Costs are integer micro-units, priced when the row is written."""

    __tablename__ = "usage_records"
    __table_args__ = (Index("ix_usage_records_tenant_id_created_at", "tenant_id", "created_at"),)

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    request_id: Mapped[str] = mapped_column(String(100), unique=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"))
    key_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    model: Mapped[str] = mapped_column(String(200))
    priority: Mapped[str] = mapped_column(String(16))  # interactive | batch
    endpoint: Mapped[str] = mapped_column(String(64))
    batch_id: Mapped[str | None] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(16))  # completed | length | cancelled | failed
    finish_reason: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    cached_tokens: Mapped[int] = mapped_column(Integer)  # part of prompt_tokens
    completion_tokens: Mapped[int] = mapped_column(Integer)
    preemptions: Mapped[int] = mapped_column(Integer)
    # Speculative decoding: draft tokens proposed and accepted (accepted ones are in
    # completion_tokens; the rest cost GPU time but are not billed as output).
    spec_proposed_tokens: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    spec_accepted_tokens: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    queue_ms: Mapped[float | None] = mapped_column(Float)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    tpot_ms: Mapped[float | None] = mapped_column(Float)
    e2e_ms: Mapped[float | None] = mapped_column(Float)
    worker_id: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))  # API enqueue time
    finished_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    price_version: Mapped[date | None] = mapped_column(Date)  # effective_from of the prices used
    input_cost_micros: Mapped[int] = mapped_column(BigInteger)  # uncached prompt tokens
    cached_input_cost_micros: Mapped[int] = mapped_column(BigInteger)
    output_cost_micros: Mapped[int] = mapped_column(BigInteger)
    cost_micros: Mapped[int] = mapped_column(BigInteger)  # the sum of the three
    written_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class UsageDaily(Base):
    """Rollup of usage_records per tenant × model × priority × UTC day (day of created_at).
    Recomputed from the raw rows for every day a writer batch touches, so it is idempotent."""

    __tablename__ = "usage_daily"

    day: Mapped[date] = mapped_column(Date, primary_key=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    priority: Mapped[str] = mapped_column(String(16), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    cached_tokens: Mapped[int] = mapped_column(BigInteger)
    completion_tokens: Mapped[int] = mapped_column(BigInteger)
    cost_micros: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class WorkerBusy(Base):
    """Seconds a worker spent inside engine steps per interval: GPU utilisation for pricing."""

    __tablename__ = "worker_busy"

    worker_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    interval_start: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    interval_s: Mapped[int] = mapped_column(Integer)
    busy_ms: Mapped[int] = mapped_column(BigInteger)
    num_steps: Mapped[int] = mapped_column(BigInteger)
