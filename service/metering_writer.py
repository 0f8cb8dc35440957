# The metering writer: a consumer group on fleetlm:metering that writes usage records to Postgres.
# Invariants:
# - XACK only after the transaction that wrote the batch has committed; a batch that fails stays
#   pending in Redis (Postgres down: records wait there and are written when it returns).
# - INSERT ... ON CONFLICT (request_id) DO NOTHING: a redelivered record never bills twice.
# - Entries pending on a writer that stopped (idle longer than claim_idle_ms) are taken over
#   with XAUTOCLAIM; a live writer re-reads its own pending entries first, which keeps them fresh.
# - Acknowledged entries are trimmed once older than retain_s (the stream doubles as a short
#   audit tail); nothing pending or undelivered is ever trimmed.
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import date
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from sqlalchemy.exc import DataError, IntegrityError, SQLAlchemyError

from metering.db import make_engine, make_sessionmaker, transaction
from metering.records import METERING_STREAM, BusyRecord, decode_record
from metering.usage_rows import apply_prices, insert_busy, insert_usage, refresh_rollups

log = logging.getLogger("fleetlm.metering")

DEAD_LETTER_STREAM = f"{METERING_STREAM}:dead"
GROUP = "metering"
BLOCK_MS = 1000  # a read waits this long for new records

Entry = tuple[str, dict[str, str] | None]


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class MeteringWriter:
    def __init__(
        self,
        redis_url: str,
        database_url: str,
        *,
        consumer: str | None = None,
        batch_size: int = 500,
        claim_idle_ms: int = 30_000,
        retain_s: float = 3600.0,
        redis_timeout_s: float = 5.0,
    ) -> None:
        # Bounded: a paused Redis must not hang the writer (it retries, run() below).
        self.redis = redis.Redis.from_url(
            redis_url,
            decode_responses=True,
            socket_timeout=redis_timeout_s + BLOCK_MS / 1000,  # reads block up to BLOCK_MS
            socket_connect_timeout=redis_timeout_s,
            retry=Retry(NoBackoff(), 0),
        )
        self.db = make_engine(database_url)
        self.sessions = make_sessionmaker(self.db)
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.batch_size = batch_size
        self.claim_idle_ms = claim_idle_ms
        self.retain_ms = int(retain_s * 1000)
        self._claim_cursor = "0-0"
        self._last_claim = 0.0
        self._last_trim = 0.0

    def close(self) -> None:
        self.redis.close()
        self.db.dispose()

    def ensure_group(self) -> None:
        try:
            self.redis.xgroup_create(METERING_STREAM, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    # -- one unit of work ----------------------------------------------------------------

    def step(self, block_ms: int | None = None) -> int:
        """Reads one batch (own pending first, then dead writers', then new), writes it and
        acknowledges it. Database errors propagate with the batch still pending."""
        entries = self._read(self._read_group("0"))  # ours, left from a failed attempt
        if not entries and time.monotonic() - self._last_claim >= self.claim_idle_ms / 4000:
            entries = self._read(self._claim_dead())
        if not entries:
            entries = self._read(self._read_group(">", block_ms))
        if not entries:
            self._maybe_trim()
            return 0
        self.write(entries)
        return len(entries)

    def _read_group(self, start: str, block_ms: int | None = None) -> list[Entry]:
        resp = self.redis.xreadgroup(
            GROUP, self.consumer, {METERING_STREAM: start}, count=self.batch_size, block=block_ms
        )
        return [e for _, entries in resp or [] for e in entries]

    def _claim_dead(self) -> list[Entry]:
        self._last_claim = time.monotonic()
        cursor, claimed, *_ = self.redis.xautoclaim(
            METERING_STREAM,
            GROUP,
            self.consumer,
            self.claim_idle_ms,
            self._claim_cursor,
            self.batch_size,
        )
        self._claim_cursor = cursor
        if claimed:
            log.info("claimed %d metering records from a stopped writer", len(claimed))
        return claimed

    def _read(self, entries: list[Entry]) -> list[Entry]:
        gone = [i for i, fields in entries if not fields]  # deleted while pending
        if gone:
            self.redis.xack(METERING_STREAM, GROUP, *gone)
        return [(i, f) for i, f in entries if f]

    # -- the unit of work: one transaction, then XACK -------------------------------------

    def write(self, entries: list[Entry]) -> None:
        usage, busy = [], []
        dead: list[tuple[str, dict[str, str], str | None, str]] = []  # entry, fields, request, why
        by_request: dict[str, tuple[str, dict[str, str]]] = {}
        for entry_id, fields in entries:
            try:
                record = decode_record(fields)
                row = record.row()
            except (KeyError, ValueError, TypeError) as exc:
                dead.append((entry_id, fields, None, f"malformed record: {exc!r}"))
                continue
            if isinstance(record, BusyRecord):
                busy.append(row)
            else:
                usage.append(row)
                by_request[record.request_id] = (entry_id, fields)
        try:
            self._commit(usage, busy)
        except (IntegrityError, DataError):
            # One bad row must not block the stream: write row by row, dead-letter the rest.
            for row in usage:
                try:
                    self._commit([row], [])
                except (IntegrityError, DataError) as exc:
                    entry_id, fields = by_request[row["request_id"]]
                    reason = f"rejected by the database: {exc.orig!r}"
                    dead.append((entry_id, fields, row["request_id"], reason))
            self._commit([], busy)
        if dead:
            pipe = self.redis.pipeline()
            for entry_id, fields, request_id, reason in dead:
                log.error(
                    "metering record %s dead-lettered: %s",
                    entry_id,
                    reason,
                    extra={"request_id": request_id},
                )
                pipe.xadd(DEAD_LETTER_STREAM, {**fields, "dead_reason": reason})
            pipe.execute()
        self.redis.xack(METERING_STREAM, GROUP, *[i for i, _ in entries])
        if log.isEnabledFor(logging.DEBUG):
            for row in usage:
                log.debug("usage record written", extra={"request_id": row["request_id"]})

    def _commit(self, usage: list[dict[str, Any]], busy: list[dict[str, Any]]) -> None:
        with transaction(self.sessions) as session:
            apply_prices(session, usage)
            written = set(insert_usage(session, usage))
            keys: set[tuple[Any, date]] = {
                (r["tenant_id"], r["created_at"].date())
                for r in usage
                if r["request_id"] in written
            }
            refresh_rollups(session, keys)
            insert_busy(session, busy)

    # -- trimming ------------------------------------------------------------------------

    def _maybe_trim(self) -> None:
        if time.monotonic() - self._last_trim < 10:
            return
        self._last_trim = time.monotonic()
        self.trim()

    def trim(self) -> int:
        """Drops acknowledged entries older than retain_s; keeps pending and undelivered ones."""
        bound = (int(time.time() * 1000) - self.retain_ms, 0)
        for group in self.redis.xinfo_groups(METERING_STREAM):
            last = group["last-delivered-id"]
            bound = min(bound, (_id(last)[0], _id(last)[1] + 1))
            if group["pending"]:
                pending = self.redis.xpending(METERING_STREAM, group["name"])
                bound = min(bound, _id(pending["min"]))
        return self.redis.xtrim(METERING_STREAM, minid=f"{bound[0]}-{bound[1]}", approximate=False)

    # -- the process ---------------------------------------------------------------------

    def run(self, stop: threading.Event, block_ms: int = BLOCK_MS, retry_s: float = 1.0) -> None:
        log.info("metering writer %s consuming %s", self.consumer, METERING_STREAM)
        ready = False
        while not stop.is_set():
            try:
                if not ready:
                    self.ensure_group()
                    ready = True
                self.step(block_ms)
            except SQLAlchemyError as exc:
                log.warning("database unavailable, records stay in Redis: %s", exc.__class__)
                stop.wait(retry_s)
            except redis.RedisError as exc:
                log.warning("redis error: %s", exc)
                stop.wait(retry_s)

    def flush(self, timeout_s: float) -> int:
        """On the way out: writes what the stream still holds (the last records of workers
        that stopped just before), for up to timeout_s. Returns the records written."""
        deadline = time.monotonic() + timeout_s
        written = 0
        while time.monotonic() < deadline:
            try:
                n = self.step(None)
            except (SQLAlchemyError, redis.RedisError) as exc:
                log.warning("could not flush the metering stream: %s", exc.__class__)
                break
            if not n:
                break
            written += n
        return written
