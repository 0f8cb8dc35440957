# The outbox's publishing on a real Redis: one trip's deltas for several requests land on each
# request's stream in order, a request that ends in the same trip has its end after its tokens,
# the first event carries the cached tokens, and the stream's TTL is set with its first event and
# refreshed every TTL_REFRESH_EVENTS events, not with every token.
from __future__ import annotations

import uuid

from engine.outputs import RequestDelta, RequestUsage
from service import streams as p
from service.events import decode_event
from service.settings import Settings
from tests.wire import queued_request
from workers.gpu.inflight import Inflight
from workers.gpu.outbox import TTL_REFRESH_EVENTS, Outbox

WORKER = "w-outbox"


def delta(f: Inflight, n: int, *, finished: bool = False) -> RequestDelta:
    usage = RequestUsage(prompt_tokens=10, cached_tokens=4, completion_tokens=n, preemptions=0)
    reason = "length" if finished else None
    return RequestDelta(
        f.request_id, [100 + n], f" t{n}", finished, reason, None, usage, 0.0, 0.0, 0.0, None
    )


def owned_requests(rds, n: int) -> dict[str, Inflight]:
    """n requests whose entries are pending on WORKER, as if it had taken them."""
    queue = f"fleetlm:q:test-outbox:{uuid.uuid4().hex[:8]}"
    rds.xgroup_create(queue, p.GROUP, id="0", mkstream=True)
    reqs = [queued_request() for _ in range(n)]
    for q in reqs:
        rds.xadd(queue, {"r": q.encode()})
    [(_, entries)] = rds.xreadgroup(p.GROUP, WORKER, {queue: ">"}, count=n)
    return {q.request_id: Inflight(q, queue, e) for q, (e, _) in zip(reqs, entries, strict=True)}


def trip(rds, outbox: Outbox, inflight: dict[str, Inflight], deltas: list) -> None:
    outbox.deltas = deltas
    pipe = rds.pipeline(transaction=False)
    written = outbox.write(pipe, inflight)
    assert not any(isinstance(r, Exception) for r in pipe.execute(raise_on_error=False))
    outbox.confirm(written)


def stream(rds, f: Inflight) -> list[dict]:
    return [decode_event(fields) for _, fields in rds.xrange(p.output_key(f.request_id))]


def test_one_trip_publishes_every_request_in_order_and_an_end_after_its_tokens(rds):
    inflight = owned_requests(rds, 2)
    a, b = inflight.values()
    outbox = Outbox(WORKER, Settings(_env_file=None))
    # Two steps' deltas in one trip (the first trip's Redis was away), a's end among them.
    trip(rds, outbox, inflight, [delta(a, 1), delta(b, 1), delta(a, 2, finished=True),
                                 delta(b, 2)])  # fmt: skip
    got_a, got_b = stream(rds, a), stream(rds, b)
    assert [e["type"] for e in got_a] == ["delta", "done"]
    assert got_a[0]["token_ids"] == [101] and got_a[0]["text"] == " t1"
    assert got_a[1]["finish_reason"] == "length" and got_a[1]["usage"]["completion_tokens"] == 2
    assert [(e["type"], e["completion_tokens"]) for e in got_b] == [("delta", 1), ("delta", 2)]
    assert [("cached_tokens" in e) for e in got_b] == [True, False]  # the first event only
    assert all(e["worker"] == WORKER for e in got_a + got_b)
    assert b.sent_tokens == b.confirmed_tokens == 2 and b.num_events == 2
    assert rds.ttl(p.output_key(b.request_id)) > 0
    # The next trip: b's stream keeps its TTL untouched until TTL_REFRESH_EVENTS events.
    key = p.output_key(b.request_id)
    rds.persist(key)
    trip(rds, outbox, inflight, [delta(b, 3)])
    assert rds.ttl(key) == -1
    b.num_events = TTL_REFRESH_EVENTS
    trip(rds, outbox, inflight, [delta(b, 4)])
    assert rds.ttl(key) > 0
    assert [e["completion_tokens"] for e in stream(rds, b)] == [1, 2, 3, 4]
