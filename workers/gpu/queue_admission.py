# How a GPU worker takes requests into its engine: entries read off the queues, and entries of
# a worker taken for dead (re-run, resumed after what its stream delivered, or ended when the
# client cancelled meanwhile).
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import redis

from engine import LLMEngine
from service.events import decode_event, error_event
from service.output_stream import follow
from service.queue_ownership import takeover_call
from service.queued_request import InvalidSampling, QueuedRequest
from service.redis_clients import UNREACHABLE
from workers.gpu.inflight import Inflight
from workers.gpu.outbox import Outbox
from workers.gpu.output_events import cancelled_before_takeover

log = logging.getLogger("fleetlm.worker")


class QueueAdmission:
    def __init__(
        self,
        engine: LLMEngine,
        redis_client: redis.Redis,
        worker_id: str,
        inflight: dict[str, Inflight],
        lock: threading.Lock,
        outbox: Outbox,
        took: Callable[[str], None],
    ) -> None:
        self.engine, self.redis, self.worker_id = engine, redis_client, worker_id
        self.inflight, self.lock, self.outbox = inflight, lock, outbox
        self.took = took  # counts a request taken, by how (workers/gpu/work_intake.py's HOW)

    def admit(
        self,
        queue: str,
        entry_id: str,
        fields: dict | None,
        *,
        counted: bool = False,
        resume: Any = None,
    ) -> None:
        """`counted`: read off the queue (not reclaimed), so its queued tokens leave the queue's
        counter; `resume`: the follower of the stream another worker started."""
        req = self._decode(queue, entry_id, fields)
        invalid = req if isinstance(req, InvalidSampling) else None
        if invalid is not None:
            req = invalid.request
        if req is None or req.request_id in self.inflight:
            return
        if counted and req.queued_tokens:
            self.outbox.add_dequeued(req.priority, req.queued_tokens)
        f = Inflight(req, queue, entry_id)
        output: list[int] = []
        if resume is not None:
            output = resume.token_ids
            f.resumed_from(resume)
        with self.lock:
            self.inflight[req.request_id] = f
        try:
            if invalid is not None:
                raise invalid
            self.engine.add_request(
                req.request_id,
                req.prompt_token_ids,
                req.sampling,
                priority=req.priority,
                arrival_time=req.enqueued_at,
                cache_salt=req.tenant_id,  # prefix-cache hits never cross tenants
                output_token_ids=output,
            )
        except (ValueError, TypeError) as exc:
            code = "worker_lost" if resume is not None else "invalid_request"
            event = error_event(str(exc), code)
            event["usage"] = f.usage(f.sent_tokens)
            self.outbox.failed.append((f, event))

    def _decode(
        self, queue: str, entry_id: str, fields: dict | None
    ) -> QueuedRequest | InvalidSampling | None:
        """The entry's request (InvalidSampling: one the engine will not take, failed by
        admit); None for an entry deleted while pending or one that does not decode (not
        written by admission: nobody waits on it, nothing to bill), which is acknowledged and
        dropped rather than stopping the worker."""
        if fields and "r" in fields:
            try:
                return QueuedRequest.decode(fields["r"])
            except InvalidSampling as invalid:
                return invalid
            except (ValueError, TypeError, KeyError) as exc:  # JSON, fields, field types
                log.error("dropped malformed queue entry %s on %s: %r", entry_id, queue, exc)
        self.outbox.acks.append((queue, entry_id))
        return None

    def admit_reclaimed(self, queue: str, claimed: list) -> None:
        """Entries of a worker taken for dead. One that is still ours (this worker was cut off
        from Redis and its own heartbeat lapsed) stays as it is; any other is taken over:
        re-run from the start, resumed after the tokens its stream already delivered, or ended
        if its client went away meanwhile."""
        for entry_id, fields in claimed:
            req = self._decode(queue, entry_id, fields)
            if isinstance(req, InvalidSampling):
                req = req.request
            if req is None or req.request_id in self.inflight:
                continue
            ttl = self.outbox.output_ttl(Inflight(req, queue, entry_id))
            try:
                raw, cancel = self.redis.eval(*takeover_call(req.request_id, self.worker_id, ttl))
            except UNREACHABLE as exc:  # still pending on us: claimed again later
                log.warning("could not take over %s: %s", req.request_id, exc)
                continue
            # A script's reply: each entry is [id, [field, value, ...]].
            follower, _ = follow([decode_event(dict(zip(f[::2], f[1::2]))) for _, f in raw])
            if follower.finished:  # ended, and its entry left behind
                self.outbox.acks.append((queue, entry_id))
            elif cancel is not None:
                f = Inflight(req, queue, entry_id)
                f.resumed_from(follower)
                with self.lock:
                    self.inflight[req.request_id] = f
                self.outbox.failed.append((f, cancelled_before_takeover(f, follower, cancel)))
            else:
                resume = follower if follower.num_tokens else None
                log.info(
                    "taking over %s from a stopped worker after %d tokens",
                    req.request_id,
                    follower.num_tokens,
                )
                self.took("reclaimed")
                self.admit(queue, entry_id, fields, resume=resume)
