# Batch records: creation, lookup and cancellation requests, scoped to a tenant. Services never
# commit; the API request or the Celery task commits at its boundary.
from __future__ import annotations

import re
import secrets
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from metering.batch_models import Batch

ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
FINAL = ("completed", "failed", "expired", "cancelled")
_WINDOW = re.compile(r"^(\d+)([smh])$")
_BATCH_ID = re.compile(r"batch_[0-9a-f]{24}")


def new_batch_id() -> str:
    return f"batch_{secrets.token_hex(12)}"


def is_batch_id(value: str) -> bool:
    """Could this be a batch's id? Anything else cannot exist: no query needed to say so."""
    return _BATCH_ID.fullmatch(value) is not None


def window_seconds(window: str) -> int:
    m = _WINDOW.match(window)
    if m is None:
        raise ValueError(f"bad completion window {window!r}")
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]


def now() -> datetime:
    return datetime.now(UTC)


def create_batch(
    session: Session,
    *,
    tenant_id: uuid.UUID,
    key_id: uuid.UUID,
    endpoint: str,
    input_file_id: str,
    completion_window: str,
    metadata: dict[str, Any] | None,
) -> Batch:
    created = now()
    batch = Batch(
        id=new_batch_id(),
        tenant_id=tenant_id,
        key_id=key_id,
        endpoint=endpoint,
        input_file_id=input_file_id,
        completion_window=completion_window,
        status="validating",
        metadata_=metadata,
        pump_token=secrets.token_hex(8),
        created_at=created,
        expires_at=created + timedelta(seconds=window_seconds(completion_window)),
    )
    session.add(batch)
    session.flush()
    return batch


def get_batch(
    session: Session, tenant_id: uuid.UUID, batch_id: str, *, lock: bool = False
) -> Batch | None:
    if not is_batch_id(batch_id):
        return None
    query = select(Batch).where(Batch.id == batch_id, Batch.tenant_id == tenant_id)
    return session.scalar(query.with_for_update() if lock else query)


def list_batches(
    session: Session, tenant_id: uuid.UUID, *, after: str | None, limit: int
) -> list[Batch]:
    query = select(Batch).where(Batch.tenant_id == tenant_id)
    if after:
        cursor = get_batch(session, tenant_id, after)
        if cursor is not None:
            query = query.where(
                (Batch.created_at < cursor.created_at)
                | ((Batch.created_at == cursor.created_at) & (Batch.id < cursor.id))
            )
    order = (Batch.created_at.desc(), Batch.id.desc())
    return list(session.scalars(query.order_by(*order).limit(limit)))


def request_cancel(batch: Batch) -> bool:
    """validating/in_progress → cancelling; False when the batch can no longer be cancelled."""
    if batch.status in ("cancelling", "cancelled"):
        return True
    if batch.status not in ("validating", "in_progress"):
        return False
    batch.status = "cancelling"
    batch.cancelling_at = now()
    return True


def lock_for_pump(session: Session, batch_id: str) -> Batch | None:
    """The batch row, locked for this transaction; None when another pump holds it."""
    query = select(Batch).where(Batch.id == batch_id).with_for_update(skip_locked=True)
    return session.scalar(query)


def rearm_stale_pumps(session: Session, stale_before: datetime) -> list[tuple[str, str]]:
    """A fresh pump token for every active batch whose pump went silent before `stale_before`
    (a lost task, a killed worker); returns the (batch id, token) pairs to send."""
    query = select(Batch).where(Batch.status.in_(ACTIVE)).with_for_update(skip_locked=True)
    armed = []
    for batch in session.scalars(query):
        if (batch.pumped_at or batch.created_at) < stale_before:
            batch.pump_token = secrets.token_hex(8)
            armed.append((batch.id, batch.pump_token))
    return armed
