# File storage: bytes in Postgres, scoped to a tenant. Services never commit.
from __future__ import annotations

import re
import secrets
import uuid
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, undefer

from metering.batch_models import StoredFile

_FILE_ID = re.compile(r"file-[0-9a-f]{24}")


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def is_file_id(value: str) -> bool:
    """Could this be a file's id? Anything else cannot exist: no query needed to say so."""
    return _FILE_ID.fullmatch(value) is not None


def create_file(
    session: Session, tenant_id: uuid.UUID, purpose: str, filename: str, content: bytes
) -> StoredFile:
    f = StoredFile(
        id=new_file_id(),
        tenant_id=tenant_id,
        purpose=purpose,
        filename=filename,
        bytes=len(content),
        content=content,
        created_at=datetime.now(UTC),
    )
    session.add(f)
    session.flush()
    return f


def get_file(
    session: Session, tenant_id: uuid.UUID, file_id: str, *, with_content: bool = False
) -> StoredFile | None:
    if not is_file_id(file_id):
        return None
    query = select(StoredFile).where(
        StoredFile.id == file_id,
        StoredFile.tenant_id == tenant_id,
        StoredFile.deleted_at.is_(None),
    )
    if with_content:
        query = query.options(undefer(StoredFile.content))
    return session.scalar(query)


def list_files(
    session: Session,
    tenant_id: uuid.UUID,
    *,
    purpose: str | None,
    after: str | None,
    limit: int,
    newest_first: bool = True,
) -> list[StoredFile]:
    query = select(StoredFile).where(
        StoredFile.tenant_id == tenant_id, StoredFile.deleted_at.is_(None)
    )
    if purpose:
        query = query.where(StoredFile.purpose == purpose)
    order = (StoredFile.created_at.desc(), StoredFile.id.desc())
    if not newest_first:
        order = (StoredFile.created_at.asc(), StoredFile.id.asc())
    if after:
        cursor = get_file(session, tenant_id, after)
        if cursor is not None:
            op = "__lt__" if newest_first else "__gt__"
            query = query.where(getattr(StoredFile.created_at, op)(cursor.created_at))
    return list(session.scalars(query.order_by(*order).limit(limit)))


def delete_file(session: Session, tenant_id: uuid.UUID, file_id: str) -> bool:
    """Deletes the bytes; the row stays (deleted_at) so ids are never reused."""
    f = get_file(session, tenant_id, file_id)
    if f is None:
        return False
    f.deleted_at = datetime.now(UTC)
    f.content = b""
    return True
