# API keys: generated once, shown once, stored as a sha256 hash with a visible prefix.
from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from metering.models import ApiKey, Tenant, TenantLimit
from metering.ratelimit import PriorityLimit

KEY_PREFIX = "flm-"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class Principal:
    tenant_id: uuid.UUID
    tenant_name: str
    key_id: uuid.UUID
    is_admin: bool = False
    limits: dict[str, PriorityLimit] = field(default_factory=dict)  # priority → limit; absent: none

    def limit(self, priority: str) -> PriorityLimit:
        return self.limits.get(priority, PriorityLimit())


def find_principal(session: Session, key: str) -> Principal | None:
    row = session.execute(
        select(ApiKey.id, ApiKey.is_admin, Tenant.id, Tenant.name)
        .join(Tenant, ApiKey.tenant_id == Tenant.id)
        .where(ApiKey.key_hash == hash_key(key), ApiKey.revoked_at.is_(None))
    ).first()
    if row is None:
        return None
    key_id, is_admin, tenant_id, tenant_name = row
    return Principal(tenant_id, tenant_name, key_id, is_admin, _limits(session, tenant_id))


def principal_of_key(session: Session, tenant_id: uuid.UUID, key_id: uuid.UUID) -> Principal:
    """The principal a batch's lines run as: its key's tenant with today's limits."""
    name = session.scalar(select(Tenant.name).where(Tenant.id == tenant_id)) or ""
    return Principal(tenant_id, name, key_id, False, _limits(session, tenant_id))


def _limits(session: Session, tenant_id: uuid.UUID) -> dict[str, PriorityLimit]:
    return {
        lim.priority: PriorityLimit(lim.max_concurrency, lim.tokens_per_minute)
        for lim in session.scalars(select(TenantLimit).where(TenantLimit.tenant_id == tenant_id))
    }


def touch_key(session: Session, key_id: uuid.UUID) -> None:
    session.execute(
        update(ApiKey).where(ApiKey.id == key_id).values(last_used_at=datetime.now(UTC))
    )


def get_or_create_tenant(session: Session, name: str) -> Tenant:
    tenant = session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is None:
        tenant = Tenant(name=name)
        session.add(tenant)
        session.flush()
    return tenant


def create_api_key(session: Session, tenant: Tenant, *, admin: bool = False) -> str:
    """Returns the plaintext key; only its hash is stored."""
    key = new_key()
    session.add(
        ApiKey(tenant_id=tenant.id, key_hash=hash_key(key), prefix=key[:10], is_admin=admin)
    )
    session.flush()
    return key
