# A real GpuWorker (tiny model on CPU) in a thread of the test process, on the embedded Redis and
# Postgres (tests/conftest.py). Tests put requests on its queues as admission does and read what
# it publishes: output events, usage records, its stats.
from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest
import redis

from metering.db import make_engine, make_sessionmaker
from metering.records import METERING_STREAM, RequestRecord, decode_record
from service import streams as p
from service.events import FINAL_EVENTS, Event, decode_event
from service.queued_request import QueuedRequest
from service.settings import Settings
from tests.waiting import wait_until
from workers.gpu.worker import GpuWorker

WORKER_ID = "w-test"
SETTINGS = Settings(
    _env_file=None,
    model="tiny",
    device="cpu",
    num_kv_blocks=128,
    heartbeat_interval_s=0.2,
    worker_dead_after_s=1.5,  # a silent consumer's entries are reclaimed after this long
    metrics_snapshot_s=0.2,
)


@pytest.fixture(scope="package")
def rds(services) -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(services.redis_url, decode_responses=True)
    yield r
    r.close()


@pytest.fixture(scope="package")
def gpu_worker(services, rds) -> Iterator[GpuWorker]:
    rds.delete(*(p.queue_key(priority) for priority in p.PRIORITIES))
    worker = GpuWorker(SETTINGS, services.redis_url, WORKER_ID)
    thread = threading.Thread(target=worker.run, name="gpu-worker", daemon=True)
    thread.start()
    wait_until(lambda: rds.exists(p.alive_key(WORKER_ID)), 60, "the worker's heartbeat")
    yield worker
    worker.stopping.set()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the worker did not stop"


@pytest.fixture(scope="package")
def sessions(services):
    engine = make_engine(services.database_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def submit(rds: redis.Redis, queued: QueuedRequest, **raw_sampling) -> str:
    """XADD to the shared queue, as admission does without routing (service/routing.py).
    `raw_sampling`: sampling fields written into the message as no admission would (values
    SamplingParams refuses)."""
    message = queued.encode()
    if raw_sampling:
        fields = json.loads(message)
        fields["sampling"] |= raw_sampling
        message = json.dumps(fields)
    return rds.xadd(p.queue_key(queued.priority), {"r": message})


def events(rds: redis.Redis, request_id: str, timeout_s: float = 60) -> list[Event]:
    """The request's output events, once the final one is there."""

    def final():
        found = [decode_event(f) for _, f in rds.xrange(p.output_key(request_id))]
        return found if found and found[-1]["type"] in FINAL_EVENTS else None

    return wait_until(final, timeout_s, f"the final event of {request_id}")


def usage_record(rds: redis.Redis, request_id: str) -> RequestRecord:
    def find():
        for _, fields in rds.xrange(METERING_STREAM):
            record = decode_record(fields)
            if isinstance(record, RequestRecord) and record.request_id == request_id:
                return record
        return None

    return wait_until(find, 30, f"the usage record of {request_id}")


def records_of(rds: redis.Redis, request_id: str) -> list[RequestRecord]:
    records = [decode_record(f) for _, f in rds.xrange(METERING_STREAM)]
    return [r for r in records if getattr(r, "request_id", None) == request_id]


def worker_stats(rds: redis.Redis) -> dict[str, str]:
    return rds.hgetall(p.stats_key(WORKER_ID))
