# Tenant administration services (the `fleetlm tenants` CLI and admin endpoints). They never
# commit: the caller's transaction does.
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from metering.keys import create_api_key
from metering.models import ApiKey, Tenant, TenantLimit

# The priorities a limit is kept for, as tenant_limits stores them: engine.priority.Priority's
# values (metering imports no engine; tests/metering/test_tenants_priorities.py holds them equal).
PRIORITIES = ("interactive", "batch")


@dataclass(frozen=True, slots=True)
class LimitRow:
    tenant: str
    priority: str
    max_concurrency: int | None
    tokens_per_minute: int | None


# A tenant name is an identifier people type, read in listings, metric labels and CSV reports:
# 1-64 characters, ASCII letters, digits, ".", "_" and "-", starting with a letter or digit (no
# spaces, no control or direction characters, nothing a spreadsheet reads as a formula).
TENANT_NAME_MAX_CHARS = 64
TENANT_NAME_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{TENANT_NAME_MAX_CHARS - 1}}}$"
TENANT_NAME_RULE = (
    f"1-{TENANT_NAME_MAX_CHARS} characters: letters A-Z and a-z, digits, '.', '_' and '-', "
    "starting with a letter or digit"
)
_TENANT_NAME = re.compile(TENANT_NAME_PATTERN)


class TenantError(ValueError):
    pass


def check_tenant_name(name: str) -> None:
    if _TENANT_NAME.fullmatch(name) is None:
        raise TenantError(f"invalid tenant name {name!r}: {TENANT_NAME_RULE}")


def tenant_by_name(session: Session, name: str) -> Tenant:
    tenant = session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is None:
        raise TenantError(f"no tenant named {name!r}")
    return tenant


def create_tenant(session: Session, name: str, *, admin: bool = False) -> tuple[Tenant, str]:
    check_tenant_name(name)
    if session.scalar(select(Tenant.id).where(Tenant.name == name)) is not None:
        raise TenantError(f"tenant {name!r} already exists")
    tenant = Tenant(name=name)
    session.add(tenant)
    session.flush()
    return tenant, create_api_key(session, tenant, admin=admin)


_UNSET = object()


def set_limits(
    session: Session,
    tenant: Tenant,
    priority: str,
    *,
    max_concurrency: int | object | None = _UNSET,
    tokens_per_minute: int | object | None = _UNSET,
) -> None:
    """Sets the given fields (None: unlimited), leaving the others as they are."""
    if priority not in PRIORITIES:
        raise TenantError(f"priority must be one of {PRIORITIES}")
    values = {
        k: v
        for k, v in (("max_concurrency", max_concurrency), ("tokens_per_minute", tokens_per_minute))
        if v is not _UNSET
    }
    if not values:
        return
    stmt = insert(TenantLimit).values(tenant_id=tenant.id, priority=priority, **values)
    session.execute(
        stmt.on_conflict_do_update(
            index_elements=["tenant_id", "priority"], set_={**values, "updated_at": func.now()}
        )
    )


def list_limits(session: Session, name: str | None = None) -> list[LimitRow]:
    query = select(Tenant.name, TenantLimit).join(TenantLimit, TenantLimit.tenant_id == Tenant.id)
    if name is not None:
        query = query.where(Tenant.name == name)
    return [
        LimitRow(t, lim.priority, lim.max_concurrency, lim.tokens_per_minute)
        for t, lim in session.execute(query.order_by(Tenant.name, TenantLimit.priority))
    ]


def list_tenants(session: Session) -> list[dict]:
    active = func.count(ApiKey.id).filter(ApiKey.revoked_at.is_(None))
    rows = session.execute(
        select(Tenant.name, Tenant.created_at, active)
        .outerjoin(ApiKey, ApiKey.tenant_id == Tenant.id)
        .group_by(Tenant.id)
        .order_by(Tenant.name)
    )
    return [{"tenant": n, "created_at": c.isoformat(), "active_keys": k} for n, c, k in rows]


def list_keys(session: Session, name: str) -> list[ApiKey]:
    tenant = tenant_by_name(session, name)
    return list(session.scalars(select(ApiKey).where(ApiKey.tenant_id == tenant.id)))


def revoke_key(session: Session, prefix: str) -> list[str]:
    """Revokes the active keys whose visible prefix (or full id) matches; returns their hashes
    (for service/revocations.py's push)."""
    matches = ApiKey.prefix == prefix
    if len(prefix) == 36:
        matches = matches | (func.cast(ApiKey.id, ApiKey.prefix.type) == prefix)
    result = session.execute(
        update(ApiKey)
        .where(matches, ApiKey.revoked_at.is_(None))
        .values(revoked_at=datetime.now(UTC))
        .returning(ApiKey.key_hash)
    )
    return list(result.scalars())
