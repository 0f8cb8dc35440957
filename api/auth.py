# Bearer key → principal (tenant + key). Keys are verified against their hash in Postgres and
# trusted for `api_key_cache_s` afterwards, so the hot path does no database read: a revoked key
# or changed limits take effect within that time. A verification stamps the key's last_used_at.
from __future__ import annotations

import asyncio
import time

from sqlalchemy.orm import Session, sessionmaker

from metering.keys import Principal, find_principal, hash_key, touch_key
from service.errors import APIError


def forbidden(message: str) -> APIError:
    return APIError(403, message, code="admin_key_required")


def unauthorized(message: str) -> APIError:
    return APIError(
        401,
        message,
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


class KeyVerifier:
    def __init__(self, sessions: sessionmaker[Session], cache_s: float) -> None:
        self._sessions = sessions
        self._cache_s = cache_s
        self._cache: dict[str, tuple[Principal, float]] = {}  # key hash → (principal, expiry)

    def _lookup(self, key: str) -> Principal | None:
        with self._sessions() as session, session.begin():
            principal = find_principal(session, key)
            if principal is not None:
                touch_key(session, principal.key_id)
            return principal

    async def verify(self, authorization: str | None) -> Principal:
        scheme, _, key = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise unauthorized("missing API key: send 'Authorization: Bearer <key>'")
        key = key.strip()
        digest = hash_key(key)
        hit = self._cache.get(digest)
        if hit is not None and hit[1] > time.monotonic():
            return hit[0]
        principal = await asyncio.to_thread(self._lookup, key)
        if principal is None:
            raise unauthorized("incorrect API key provided")
        self._cache[digest] = (principal, time.monotonic() + self._cache_s)
        return principal
