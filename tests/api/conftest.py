# The API in process: the real app (create_app, its lifespan) on the embedded Redis and Postgres
# (tests/conftest.py), driven by Starlette's TestClient, with the official openai SDK on top of
# it. No worker process: where a test needs one, it plays the worker over the wire
# (service/streams.py, service/queued_request.py, service/events.py): a heartbeat key, the queue
# entry it reads, the events it publishes.
from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import openai
import pytest
import redis
from fastapi.testclient import TestClient

from api.main import create_app
from engine.usage import RequestUsage
from metering.db import make_engine, make_sessionmaker, transaction
from metering.tenants import create_tenant, set_limits
from service import streams as p
from service.events import DeltaEvent, DoneEvent, Event, encode_event
from service.queued_request import QueuedRequest
from service.settings import Settings
from tests.waiting import wait_until

SETTINGS = Settings(
    _env_file=None,
    model="tiny",
    num_kv_blocks=256,  # max_model_len 4096, as the e2e server's
    relay_poll_s=0.1,
    no_worker_timeout_s=0.5,
    worker_dead_after_s=2.0,
    api_key_cache_s=0.2,
    load_refresh_s=0.0,  # admission reads the queues' load every time (tests set it)
    control_timeout_s=1.0,
)


@pytest.fixture(scope="package")
def app_client(services) -> Iterator[TestClient]:
    app = create_app(SETTINGS, services.redis_url, services.database_url)
    with TestClient(app) as client:  # runs the lifespan
        yield client
    r = redis.Redis.from_url(services.redis_url)
    r.delete(*(p.queue_key(priority) for priority in p.PRIORITIES))  # nothing left for workers
    r.close()


@pytest.fixture(scope="package")
def sessions(services):
    engine = make_engine(services.database_url)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture
def rds(services) -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(services.redis_url, decode_responses=True)
    yield r
    r.close()


@dataclass
class Tenant:
    name: str
    id: uuid.UUID
    key: str


@pytest.fixture
def make_tenant(sessions):
    def make(admin: bool = False, **limits) -> Tenant:
        """limits: priority=(max_concurrency, tokens_per_minute)."""
        name = f"t-{uuid.uuid4().hex[:8]}"
        with transaction(sessions) as s:
            tenant, key = create_tenant(s, name, admin=admin)
            for priority, (concurrency, tpm) in limits.items():
                set_limits(s, tenant, priority, max_concurrency=concurrency, tokens_per_minute=tpm)
            return Tenant(name, tenant.id, key)

    return make


@pytest.fixture
def tenant(make_tenant) -> Tenant:
    return make_tenant()


def sdk(app_client: TestClient, key: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key=key, max_retries=0, http_client=app_client
    )


@dataclass
class PlayedWorker:
    """The test as the worker: alive while it heartbeats, takes queue entries, publishes."""

    rds: redis.Redis
    id: str = field(default_factory=lambda: f"test-worker-{uuid.uuid4().hex[:6]}")

    def heartbeat(self) -> None:
        self.rds.set(p.alive_key(self.id), "{}", px=60_000)  # until die()
        self.rds.sadd(p.WORKERS_SET, self.id)

    def die(self) -> None:
        self.rds.delete(p.alive_key(self.id))

    def take(self, tenant: Tenant, priority: str = "interactive") -> QueuedRequest:
        """The tenant's one queued request, once admission has enqueued it; taken off the queue
        (as a worker's finish does), so nothing is left for the next tests' workers."""
        queue = p.queue_key(priority)

        def find():
            for entry_id, fields in self.rds.xrange(queue):
                queued = QueuedRequest.decode(fields["r"])
                if queued.tenant_id == str(tenant.id):
                    self.rds.xdel(queue, entry_id)
                    return queued
            return None

        return wait_until(find, 10, f"{tenant.name}'s request on the {priority} queue")

    def publish(self, request_id: str, *events: Event) -> None:
        for event in events:
            self.rds.xadd(p.output_key(request_id), encode_event(event))

    def delta(self, text: str, n: int) -> DeltaEvent:
        return {"type": "delta", "text": text, "worker": self.id, "completion_tokens": n}

    def done(self, text: str, prompt_tokens: int, completion_tokens: int) -> DoneEvent:
        counts = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
        return {
            "type": "done",
            "text": text,
            "worker": self.id,
            "finish_reason": "length",
            "usage": RequestUsage.from_json(counts).to_json(),
        }


@pytest.fixture
def worker(rds) -> Iterator[PlayedWorker]:
    w = PlayedWorker(rds)
    w.heartbeat()
    yield w
    w.die()
    rds.srem(p.WORKERS_SET, w.id)


def bad_request(app_client, key: str, body: dict, path: str = "/v1/chat/completions") -> dict:
    """POST a generation request with `body` added to a minimal valid one; assert a 400 and
    return its OpenAI error object."""
    base = {"messages": [{"role": "user", "content": "hi"}]}
    if path != "/v1/chat/completions":
        base = {"prompt": "hi"}
    r = app_client.post(
        path,
        json={"model": "tiny", **base, **body},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    return error
