# One step of a batch's state machine (a "pump"), run by the Celery task `advance` while the batch
# is active: validate the input file, collect finished lines, fan out pending ones with
# back-pressure (at most batch_max_inflight lines of a batch queued or running), drop queued lines
# of a cancelled or expired batch, and finalize (output and error files, usage roll-up).
#
# A pump holds the batch row's lock (FOR UPDATE SKIP LOCKED) for its whole transaction, so two
# pumps of one batch never overlap, and everything it decides commits at once. Redis side effects
# before the commit are idempotent (the enqueue is once-per-request-id; output streams are deleted
# only after the commit), so a pump killed at any point is simply run again.
from __future__ import annotations

import asyncio
import json
import logging
from datetime import timedelta
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from engine.priority import Priority
from engine.usage import RequestUsage
from metering import batch_requests as batch_lines
from metering.batch_input import MalformedFile, check_batch_file
from metering.batch_models import Batch, BatchRequest
from metering.batches import ACTIVE, FINAL, lock_for_pump, now, rearm_stale_pumps
from metering.files import create_file, get_file
from metering.keys import principal_of_key
from service import streams as p
from service.errors import event_error
from service.events import FINAL_EVENTS, Event, decode_event
from service.limit_reservations import release_call
from service.output_stream import follow
from service.prepare import chat_tool_mode, completion_echo, prompt_ids
from service.queue_ownership import drop_unread_call
from service.queued_request import QueuedRequest
from service.redis_clients import async_redis, sync_redis
from service.schemas.chat import ChatCompletionRequest, ChatFormatter
from service.schemas.choices import Choices
from service.schemas.completions import CompletionFormatter, CompletionRequest
from service.schemas.models import ModelCard
from service.schemas.sampling import priority_tier
from service.schemas.usage import Usage
from service.settings import Settings
from workers.batch import admission as ba

log = logging.getLogger("fleetlm.batches")

MAX_REPORTED_ERRORS = 100  # in the batch object's `errors`; the error file lists them all


class Runner:
    def __init__(self, settings: Settings, sessions: sessionmaker[Session], redis_url: str):
        from engine.tokenizer import Tokenizer

        self.settings = settings
        self.sessions = sessions
        self.redis_url = redis_url
        self.redis = sync_redis(redis_url, settings)
        self.tokenizer = Tokenizer.for_model(settings.model)
        self.model_card = ModelCard(
            id=settings.model_name, created=0, max_model_len=settings.resolved_max_model_len()
        )

    # -- the pump ---------------------------------------------------------------------------

    def pump(self, batch_id: str, token: str) -> bool:
        """One step; True while the batch needs another."""
        done_streams: list[str] = []
        with self.sessions() as session, session.begin():
            batch = lock_for_pump(session, batch_id)
            if batch is None or batch.pump_token != token or batch.status in FINAL:
                return False  # another pump holds it, or this chain was superseded
            batch.pumped_at = now()
            if batch.status == "validating":
                self._validate(session, batch)
            if batch.expires_at <= batch.pumped_at and batch.status == "in_progress":
                batch.expiring = True
            if batch.status in ("in_progress", "cancelling"):
                done_streams = self._collect(session, batch)
                if batch.status == "cancelling" or batch.expiring:
                    self._drop_queued(session, batch)
                else:
                    self._fan_out(session, batch)
                self._count(session, batch)
                if not batch_lines.count_in_state(session, batch, "queued") and (
                    batch.status == "cancelling"
                    or batch.expiring
                    or not batch_lines.count_in_state(session, batch, "pending")
                ):
                    if batch.status == "in_progress":
                        batch.status, batch.finalizing_at = "finalizing", now()
                    else:
                        self._finalize(session, batch)
            elif batch.status == "finalizing":
                self._finalize(session, batch)
            active = batch.status in ACTIVE
        if done_streams:
            self.redis.delete(*(p.output_key(r) for r in done_streams))
        return active

    def sweep(self) -> list[tuple[str, str]]:
        """Beat: re-arms the pump of every active batch whose pump went silent (a lost task, a
        killed worker); returns the (batch id, token) pairs to send."""
        stale = now() - timedelta(seconds=self.settings.batch_stale_s)
        with self.sessions() as session, session.begin():
            return rearm_stale_pumps(session, stale)

    # -- steps ------------------------------------------------------------------------------

    def _validate(self, session: Session, batch: Batch) -> None:
        """validating → in_progress with its lines stored, or → failed with the problems in
        `errors` and an error file. Never raises for bad input: a batch that cannot start ends
        here, so no pump retries it forever."""
        f = get_file(session, batch.tenant_id, batch.input_file_id, with_content=True)
        if f is None:
            message = f"the input file {batch.input_file_id} no longer exists"
            self._fail_validation(session, batch, [MalformedFile(message)])
            return
        lines, problems = check_batch_file(f.content, self.settings.batch_max_lines, batch.endpoint)
        if problems:
            self._fail_validation(session, batch, problems)
            return
        try:
            with session.begin_nested():  # a savepoint: the batch row stays ours on failure
                batch_lines.add_lines(session, batch, lines)
                session.flush()
        except DBAPIError as exc:  # the input checks should make this unreachable
            log.exception("batch %s: storing its lines failed", batch.id)
            message = f"the input could not be stored ({type(exc.orig).__name__})"
            self._fail_validation(session, batch, [MalformedFile(message)])
            return
        batch.total = len(lines)
        batch.status, batch.in_progress_at = "in_progress", now()

    def _fail_validation(
        self, session: Session, batch: Batch, problems: list[MalformedFile]
    ) -> None:
        errors = [
            {"code": "invalid_file", "message": str(p), "param": None, "line": p.line}
            for p in problems
        ]
        batch.errors = errors[:MAX_REPORTED_ERRORS]
        lines = [
            {"id": None, "custom_id": p.custom_id, "response": None, "error": e}
            for p, e in zip(problems, errors)
        ]
        self._write_file(session, batch, "error", lines)
        batch.status, batch.failed_at = "failed", now()
        log.info("batch %s failed validation: %s", batch.id, errors[0]["message"])

    def _write_file(self, session: Session, batch: Batch, kind: str, lines: list[dict]) -> None:
        content = "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines)
        name = f"{batch.id}_{kind}.jsonl"
        f = create_file(session, batch.tenant_id, "batch_output", name, content.encode())
        setattr(batch, f"{kind}_file_id", f.id)

    def _fan_out(self, session: Session, batch: Batch) -> None:
        room = self.settings.batch_max_inflight - batch_lines.count_in_state(
            session, batch, "queued"
        )
        if room <= 0:
            return
        rows = batch_lines.lines_in_state(session, batch, "pending", room)
        if rows:
            asyncio.run(self._admit_all(session, batch, rows))

    async def _admit_all(self, session: Session, batch: Batch, rows: list[BatchRequest]) -> None:
        client = async_redis(self.redis_url, self.settings)
        context = ba.BatchAdmissionContext(self.settings, client, self.tokenizer, self.model_card)
        principal = principal_of_key(session, batch.tenant_id, batch.key_id)
        try:
            for row in rows:
                result = await ba.admit(
                    context, principal, batch.endpoint, row.body, row.request_id, batch.id
                )
                if isinstance(result, ba.Later):
                    break  # the tenant's batch limits or the queue are full: next pump
                if isinstance(result, ba.Rejected):
                    row.state, row.status_code, row.response = (
                        "failed",
                        result.status_code,
                        result.error,
                    )
                else:
                    row.state, row.entry_id = "queued", result.entry_id
        finally:
            await client.aclose()

    def _collect(self, session: Session, batch: Batch) -> list[str]:
        rows = batch_lines.lines_in_state(session, batch, "queued")
        if not rows:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for row in rows:
            pipe.xrevrange(p.output_key(row.request_id), count=1)
        done = []
        for row, last in zip(rows, pipe.execute()):
            if not last or decode_event(last[0][1])["type"] not in FINAL_EVENTS:
                continue
            raw = [decode_event(f) for _, f in self.redis.xrange(p.output_key(row.request_id))]
            follower, events = follow(raw)  # a stale worker's final event may come last
            if not follower.finished:
                continue
            self._record(batch, row, events)
            done.append(row.request_id)
        return done

    def _record(self, batch: Batch, row: BatchRequest, events: list[Event]) -> None:
        final = events[-1]
        usage = RequestUsage.from_json(final.get("usage"))
        row.prompt_tokens = usage.prompt_tokens
        row.cached_tokens = usage.cached_tokens
        row.completion_tokens = usage.completion_tokens
        if final["type"] == "error":
            err = event_error(final)
            row.state, row.status_code, row.response = "failed", err.status, err.body()
            return
        model = row.body.get("model", self.model_card.id)
        if batch.endpoint == "/v1/chat/completions":
            body = ChatCompletionRequest.model_validate(row.body)  # admitted: it is valid
            context = ba.BatchAdmissionContext(self.settings, None, self.tokenizer, self.model_card)
            fmt = ChatFormatter(
                row.request_id, model, priority_tier(Priority.BATCH), chat_tool_mode(context, body)
            )
        else:
            body = CompletionRequest.model_validate(row.body)
            context = ba.BatchAdmissionContext(self.settings, None, self.tokenizer, self.model_card)
            echo = completion_echo(context, body, prompt_ids(context, body)) if body.echo else None
            fmt = CompletionFormatter(row.request_id, model, echo, body.logprobs is not None)
        body = Choices(fmt, body.n).response(events, Usage.of(usage))
        row.state, row.status_code, row.response = "done", 200, body

    def _drop_queued(self, session: Session, batch: Batch) -> None:
        rows = batch_lines.lines_in_state(session, batch, "queued")
        ttl = self.settings.output_ttl_s
        for row in rows:
            self.redis.set(p.cancel_key(row.request_id), "1", ex=ttl)
            raw = self.redis.eval(*drop_unread_call(p.queue_key("batch"), row.entry_id))
            if raw is None:
                continue  # a worker holds it: its final event comes once the cancel lands
            if raw:
                q = QueuedRequest.decode(raw)
                if q.reservation is not None:
                    self.redis.eval(
                        *release_call(q.tenant_id, q.priority, q.request_id, q.reservation, 0)
                    )
            row.state = "dropped"

    def _count(self, session: Session, batch: Batch) -> None:
        by_state = batch_lines.totals_by_state(session, batch)
        none = batch_lines.StateTotals()
        batch.completed = by_state.get("done", none).lines
        batch.failed = by_state.get("failed", none).lines
        if batch.expiring:
            batch.failed += by_state.get("dropped", none).lines
        batch.input_tokens = sum(t.prompt_tokens for t in by_state.values())
        batch.cached_tokens = sum(t.cached_tokens for t in by_state.values())
        batch.output_tokens = sum(t.completion_tokens for t in by_state.values())

    def _finalize(self, session: Session, batch: Batch) -> None:
        out, err = [], []
        for row in batch_lines.all_lines(session, batch):
            line: dict[str, Any] = {"id": row.request_id, "custom_id": row.custom_id}
            if row.state in ("done", "failed"):
                response = {
                    "status_code": row.status_code,
                    "request_id": row.request_id,
                    "body": row.response,
                }
                line |= {"response": response, "error": None}
                (out if row.state == "done" else err).append(line)
            elif batch.expiring:  # never ran: OpenAI lists these in the error file
                message = "This request could not be executed before the completion window expired."
                line |= {"response": None, "error": {"code": "batch_expired", "message": message}}
                err.append(line)
        self._count(session, batch)
        for kind, lines in (("output", out), ("error", err)):
            if lines:
                self._write_file(session, batch, kind, lines)
        t = now()
        if batch.status == "cancelling":
            batch.status, batch.cancelled_at = "cancelled", t
        elif batch.expiring:
            batch.status, batch.expired_at = "expired", t
        else:
            batch.status, batch.completed_at = "completed", t
        log.info("batch %s %s: %d ok, %d failed", batch.id, batch.status, len(out), len(err))
