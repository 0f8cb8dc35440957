# The rules every reader of an output stream applies (service/output_stream.py): a resume event
# hands the stream to another worker, after which the old worker's events are stale; a delta
# that does not move past the delivered position is a retried round trip's copy.
from __future__ import annotations

from service.output_stream import OutputFollower, follow


def delta(worker: str, n: int, ids: list[int], text: str = "x", **extra) -> dict:
    return {"type": "delta", "worker": worker, "completion_tokens": n, "token_ids": ids,
            "text": text} | extra  # fmt: skip


def test_a_resume_hands_the_stream_over_and_the_old_worker_is_ignored():
    events = [
        delta("a", 1, [5], cached_tokens=16),
        delta("a", 2, [6]),
        {"type": "resume", "worker": "b"},
        delta("a", 3, [7], text="stale"),  # the old worker was only cut off from Redis
        delta("b", 3, [8]),
        {"type": "done", "worker": "a", "text": "", "finish_reason": "length", "usage": {}},
        {"type": "done", "worker": "b", "text": "!", "finish_reason": "length", "usage": {}},
    ]
    follower, delivered = follow(events)
    assert [(e["type"], e.get("worker")) for e in delivered] == [
        ("delta", "a"), ("delta", "a"), ("delta", "b"), ("done", "b"),
    ]  # fmt: skip
    assert follower.token_ids == [5, 6, 8] and follower.num_tokens == 3
    assert follower.cached_tokens == 16 and follower.owner == "b" and follower.finished


def test_a_retried_round_trip_delivers_nothing_twice():
    follower = OutputFollower()
    first = [delta("a", 1, [5]), delta("a", 3, [6, 7])]
    assert all(follower.accept(e) for e in first)
    assert not any(follower.accept(e) for e in first)  # the same deltas again
    assert follower.accept(delta("a", 4, [8]))
    assert follower.token_ids == [5, 6, 7, 8]


def test_the_relays_own_errors_carry_no_worker_and_end_the_stream():
    follower = OutputFollower()
    assert follower.accept(delta("a", 1, [5]))
    assert follower.accept({"type": "error", "code": "worker_lost", "message": "gone"})
    assert follower.finished and not follower.accept(delta("a", 2, [6]))
