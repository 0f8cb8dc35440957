# Bearer key → principal (tenant + key). Keys are verified against their hash in Postgres and
# trusted for `api_key_cache_s` afterwards, so the hot path does no database read: changed
# limits take effect within that time. A revoked key is refused at once: revocation pushes its
# hash to every API process (api/revoked_keys.py), checked before the cache. A verification
# stamps the key's last_used_at.
#
# Postgres away: serving must not stop with it. A key verified within `api_key_stale_s` keeps
# working from the cache (with the limits it had) while the database does not answer within
# `database_timeout_s`; a key never verified gets 503 with Retry-After (it may be valid). One
# lookup per key at a time: while one hangs on an unresponsive database, other requests with that
# key use the cache at once instead of queueing behind it. A lookup a request timed out on is not
# joined again (it hangs on the outage): once the database is back, the next request looks up
# afresh.
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Container
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session, sessionmaker

from metering.keys import Principal, find_principal, hash_key, touch_key
from service.errors import APIError, database_unavailable

log = logging.getLogger("fleetlm.api")

DATABASE_ERRORS = (DBAPIError, PoolTimeoutError)
# Lookups run on a few threads of their own: lookups hung on a stopped database (a new one may
# start per key and timeout) queue there instead of taking threads the rest of the API uses.
MAX_LOOKUP_THREADS = 8


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
    def __init__(
        self,
        sessions: sessionmaker[Session],
        cache_s: float,
        *,
        stale_s: float = 3600.0,
        timeout_s: float = 2.0,
        retry_after_s: int = 2,
        revoked: Container[str] = frozenset(),
    ) -> None:
        self._sessions = sessions
        self._revoked = revoked  # hashes of keys revoked (pushed through Redis)
        self._cache_s, self._stale_s = cache_s, stale_s
        self._timeout_s, self._retry_after_s = timeout_s, retry_after_s
        self._cache: dict[str, tuple[Principal, float]] = {}  # key hash → (principal, verified)
        self._lookups: dict[str, asyncio.Future] = {}  # key hash → the lookup to join
        self._threads = ThreadPoolExecutor(MAX_LOOKUP_THREADS, thread_name_prefix="key-lookup")

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
        if digest in self._revoked:
            self._cache.pop(digest, None)
            raise unauthorized("incorrect API key provided")
        hit = self._cache.get(digest)
        age = time.monotonic() - hit[1] if hit is not None else None
        if hit is not None and age < self._cache_s:
            return hit[0]
        stale = hit[0] if hit is not None and age < self._stale_s else None
        lookup = self._lookups.get(digest)
        if lookup is not None and stale is not None:
            return stale  # a lookup of this key is already waiting on the database
        deadline = time.monotonic() + self._timeout_s
        try:
            principal = await self._looked_up(key, digest, deadline)
        except (*DATABASE_ERRORS, TimeoutError) as exc:
            if stale is not None:
                log.warning(
                    "database unavailable (%s): key served from the cache", type(exc).__name__
                )
                return stale
            raise database_unavailable(self._retry_after_s) from exc
        if principal is None:
            self._cache.pop(digest, None)
            raise unauthorized("incorrect API key provided")
        self._cache[digest] = (principal, time.monotonic())
        return principal

    async def _looked_up(self, key: str, digest: str, deadline: float) -> Principal | None:
        """The key's row, by the lookup of this key in flight or a new one. A joined lookup that
        failed gets one fresh try of this request's own within its time."""
        pending = self._lookups.get(digest)
        lookup = pending if pending is not None else self._start_lookup(key, digest)
        try:
            return await self._within(lookup, digest, deadline)
        except DATABASE_ERRORS:
            if pending is None or time.monotonic() >= deadline:
                raise
        lookup = self._lookups.get(digest) or self._start_lookup(key, digest)
        return await self._within(lookup, digest, deadline)

    async def _within(self, lookup: asyncio.Future, digest: str, deadline: float):
        try:
            return await asyncio.wait_for(asyncio.shield(lookup), deadline - time.monotonic())
        except TimeoutError:
            # It hangs on a database that stopped answering, and may hang on after the database
            # is back: later requests start their own instead of joining it.
            if self._lookups.get(digest) is lookup:
                del self._lookups[digest]
            raise

    def _start_lookup(self, key: str, digest: str) -> asyncio.Future:
        lookup = asyncio.get_running_loop().run_in_executor(self._threads, self._lookup, key)
        self._lookups[digest] = lookup

        def forget(_: asyncio.Future) -> None:
            if self._lookups.get(digest) is lookup:  # not a newer one
                del self._lookups[digest]

        lookup.add_done_callback(forget)
        return lookup
