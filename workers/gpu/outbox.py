# Everything a worker must get into Redis: engine deltas to publish, requests to end, unstarted
# requests to hand back, entries to acknowledge, the queues' token counters to decrement, a busy
# record. Each round trip writes the whole outbox into its pipeline and the outbox lets go of it
# only once Redis took that round trip (confirm). A round trip that failed — Redis paused,
# restarting, a connection cut half way — is simply written again: readers skip a delta they
# already have (service/output_stream.py), ends and hand-backs are fenced on queue-entry
# ownership (service/queue_ownership.py), acknowledgements and a busy record twice are harmless.
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis

from engine.outputs import RequestDelta
from metering.records import RequestRecord
from service import streams as p
from service.events import DoneEvent, ErrorEvent
from service.queue_ownership import finish_call, requeue_call
from service.settings import Settings
from workers.gpu.inflight import Inflight
from workers.gpu.output_events import delta_event_json, final_event
from workers.gpu.usage import usage_record

# A stream's TTL is set with its first event and refreshed every this many (and at its end),
# not with every token: one command per token instead of two on the step's round trip.
TTL_REFRESH_EVENTS = 256

# A step's token deltas, one per running request, go out in one call instead of one XADD each:
# redis-py spends ~10 µs of Python packing and parsing each command of a pipeline, which at 130
# running requests was most of the round trip (benchmarks/exchange_cost.py); Redis's own work
# is the same XADDs. KEYS: the output streams. ARGV per key: the encoded event, then the TTL to
# set in seconds (0: leave it). Field "e", as service/events.py's encode_event writes it.
PUBLISH_SCRIPT = """
for i = 1, #KEYS do
  redis.call('XADD', KEYS[i], '*', 'e', ARGV[2 * i - 1])
  local ttl = tonumber(ARGV[2 * i])
  if ttl > 0 then redis.call('EXPIRE', KEYS[i], ttl) end
end
return #KEYS
"""


@dataclass(slots=True)
class Written:
    """What one round trip carried out of the outbox."""

    num_deltas: int = 0
    num_failed: int = 0
    num_requeues: int = 0
    num_acks: int = 0
    dequeued: dict[str, int] = field(default_factory=dict)
    sent: list[tuple[Inflight, int]] = field(default_factory=list)  # (request, tokens through)
    finished: list[tuple[Inflight, RequestRecord]] = field(default_factory=list)


class Outbox:
    def __init__(self, worker_id: str, settings: Settings) -> None:
        self.worker_id, self.settings = worker_id, settings
        self.deltas: list[RequestDelta] = []
        self.failed: list[tuple[Inflight, ErrorEvent]] = []  # requests to end with this event
        self.requeues: list[Inflight] = []  # unstarted requests handed back (drain, shutdown)
        self.acks: list[tuple[str, str]] = []  # (queue, entry) of entries to drop
        self.dequeued: dict[str, int] = {}  # priority → queued tokens read off its queue
        self.busy_record: dict[str, str] | None = None

    def failing(self) -> set[str]:
        return {f.request_id for f, _ in self.failed}

    def finishing(self) -> set[str]:
        """Requests whose end the engine produced and which wait to be published."""
        return {d.request_id for d in self.deltas if d.finished}

    def drop(self, request_ids: set[str]) -> None:
        """Forget the deltas and ends of these requests (ended otherwise, or lost)."""
        self.deltas = [d for d in self.deltas if d.request_id not in request_ids]
        self.failed = [(f, e) for f, e in self.failed if f.request_id not in request_ids]

    def tokens_through(self, f: Inflight) -> int:
        """Output tokens published once the deltas waiting for this request are sent too."""
        waiting = [d.usage.completion_tokens for d in self.deltas if d.request_id == f.request_id]
        return max([f.sent_tokens, *waiting])

    def add_dequeued(self, priority: str, tokens: int) -> None:
        self.dequeued[priority] = self.dequeued.get(priority, 0) + tokens

    # -- a round trip -------------------------------------------------------------------------

    def write(self, pipe: redis.client.Pipeline, inflight: dict[str, Inflight]) -> Written:
        out = Written(
            num_deltas=len(self.deltas),
            num_failed=len(self.failed),
            num_requeues=len(self.requeues),
            num_acks=len(self.acks),
            dequeued=dict(self.dequeued),
        )
        # Every request's deltas before any end: its own end is its last delta, so it still
        # follows its tokens on the stream.
        keys: list[str] = []
        args: list[str | int] = []
        ends: list[tuple[Inflight, RequestDelta]] = []
        for delta in self.deltas:
            f = inflight.get(delta.request_id)
            if f is None:
                continue
            if delta.finished:
                ends.append((f, delta))
            else:
                self._publish(keys, args, out, f, delta)
        if keys:
            pipe.eval(PUBLISH_SCRIPT, len(keys), *keys, *args)
        for f, delta in ends:
            if f.final is None:  # else: the engine's end of a request the worker ended itself
                self._finish(pipe, out, f, final_event(self.worker_id, f, delta), delta)
        for f, event in self.failed:
            self._finish(pipe, out, f, event)
        for f in self.requeues:
            pipe.eval(*requeue_call(f.req, f.queue, f.entry_id, self.worker_id))
        for queue, entry_id in self.acks:
            pipe.xack(queue, p.GROUP, entry_id)
            pipe.xdel(queue, entry_id)
        for priority, tokens in out.dequeued.items():
            pipe.decrby(p.queued_tokens_key(priority), tokens)
        if self.busy_record is not None:
            pipe.xadd(p.METERING_STREAM, self.busy_record)
        return out

    def confirm(self, out: Written) -> None:
        """Redis took the round trip that carried `out`."""
        del self.deltas[: out.num_deltas]
        del self.failed[: out.num_failed]
        del self.requeues[: out.num_requeues]
        del self.acks[: out.num_acks]
        for priority, tokens in out.dequeued.items():
            self.dequeued[priority] -= tokens
        self.busy_record = None
        for f, tokens in out.sent:
            f.confirmed_tokens = max(f.confirmed_tokens, tokens)

    def _publish(
        self, keys: list, args: list, out: Written, f: Inflight, delta: RequestDelta
    ) -> None:
        """One delta event onto PUBLISH_SCRIPT's arguments."""
        keys.append(p.output_key(delta.request_id))
        args.append(delta_event_json(self.worker_id, f, delta))
        args.append(self.output_ttl(f) if f.num_events % TTL_REFRESH_EVENTS == 0 else 0)
        f.num_events += 1
        f.published = True
        f.sent_tokens = max(f.sent_tokens, delta.usage.completion_tokens)
        out.sent.append((f, f.sent_tokens))

    def _finish(
        self, pipe, out: Written, f: Inflight, event: DoneEvent | ErrorEvent, delta: Any = None
    ) -> None:
        """The final event, the usage record, the reservation's release and the XACK of one
        request: one Lua call, which does nothing if another worker took the request over."""
        event["worker"] = self.worker_id
        record = usage_record(f, event, delta, self.worker_id)
        event["usage"] = record.counts  # what the row bills, every counter named
        ttl = self.output_ttl(f)
        pipe.eval(*finish_call(f.req, f.queue, f.entry_id, self.worker_id, event, ttl, record))
        out.finished.append((f, record))

    def output_ttl(self, f: Inflight) -> int:
        # A batch line's output waits for the batch pump (which deletes it), not a live client.
        settings = self.settings
        return settings.batch_output_ttl_s if f.req.batch_id else settings.output_ttl_s
