# Schemathesis over the app's own /openapi.json, in process (ASGI), with a tenant key: generated
# requests, valid and invalid, for every operation; zero 5xx and zero responses that the document
# does not describe (status, media type, body, headers). A bounded number of examples per
# operation and a fixed seed keep it fast and repeatable. The test plays the worker for its
# tenant's generations (answers each at once), so a valid generation ends in a 200.
from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import hypothesis
import pytest
import redis
import schemathesis
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.python.asgi import shutdown_lifespans
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from api.main import create_app
from metering.batches import create_batch
from metering.db import transaction
from metering.files import create_file
from metering.records import usage_counts
from metering.tenants import create_tenant
from service import streams as p
from service.events import encode_event
from service.queued_request import QueuedRequest
from tests.api.conftest import SETTINGS

pytestmark = pytest.mark.timeout(300)

MAX_EXAMPLES = 100  # per operation and generation mode
SEED = 18
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]


class EchoWorker:
    """Heartbeats, and answers each of one tenant's queued requests with a short completion."""

    def __init__(self, rds: redis.Redis, tenant_id: str) -> None:
        self.rds, self.tenant_id = rds, tenant_id
        self.id = f"echo-{uuid.uuid4().hex[:6]}"
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="echo-worker", daemon=True)

    def __enter__(self) -> EchoWorker:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(timeout=10)
        self.rds.delete(p.alive_key(self.id))
        self.rds.srem(p.WORKERS_SET, self.id)

    def _run(self) -> None:
        while not self.stopping.wait(0.01):
            self.rds.set(p.alive_key(self.id), "{}", px=5_000)
            self.rds.sadd(p.WORKERS_SET, self.id)
            for priority in p.PRIORITIES:
                for entry_id, fields in self.rds.xrange(p.queue_key(priority), count=100):
                    queued = QueuedRequest.decode(fields["r"])
                    if queued.tenant_id == self.tenant_id:
                        self.rds.xdel(p.queue_key(priority), entry_id)
                        self._answer(queued)

    def _answer(self, queued: QueuedRequest) -> None:
        counts = {"prompt_tokens": len(queued.prompt_token_ids), "completion_tokens": 1}
        done = {
            "type": "done",
            "text": "ok",
            "worker": self.id,
            "finish_reason": "length",
            "usage": usage_counts(counts),
        }
        self.rds.xadd(p.output_key(queued.request_id), encode_event(done))
        self.rds.expire(p.output_key(queued.request_id), 60)


@dataclass
class Fuzzer:
    tenant_id: str
    key: str
    ids: dict[str, str]  # a real object id for each path parameter name, and for input_file_id


@pytest.fixture(scope="module")
def fuzzer(sessions) -> Fuzzer:
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}
    with transaction(sessions) as s:
        tenant, key = create_tenant(s, f"fuzz-{uuid.uuid4().hex[:8]}")
        f = create_file(s, tenant.id, "batch", "in.jsonl", json.dumps(line).encode() + b"\n")
        batch = create_batch(
            s,
            tenant_id=tenant.id,
            key_id=tenant.api_keys[0].id,
            endpoint="/v1/chat/completions",
            input_file_id=f.id,
            completion_window="24h",
            metadata=None,
        )
    ids = {"file_id": f.id, "input_file_id": f.id, "batch_id": batch.id, "model_id": "tiny"}
    ids["file"] = json.dumps({**line, "body": {"model": "tiny", "messages": []}}) + "\n"
    return Fuzzer(str(tenant.id), key, ids)


@pytest.fixture(scope="module")
def api_schema(services, fuzzer) -> Iterator[schemathesis.BaseSchema]:
    rds = redis.Redis.from_url(services.redis_url, decode_responses=True)
    app = create_app(SETTINGS, services.redis_url, services.database_url)
    with EchoWorker(rds, fuzzer.tenant_id):
        yield schemathesis.openapi.from_asgi("/openapi.json", app)
        shutdown_lifespans()  # the app's Redis and Postgres pools, before the services stop
    rds.close()


def cases() -> list[tuple[str, str, GenerationMode]]:
    """(method, path, mode) for every documented operation: valid requests, and invalid ones
    where there is input to get wrong. Building the document needs no services."""
    document = create_app(SETTINGS, "redis://unused", "postgresql://unused").openapi()
    found = []
    for path, ops in document["paths"].items():
        for method, op in ops.items():
            found.append((method.upper(), path, GenerationMode.POSITIVE))
            # Path parameters are plain strings (unknown ids are 404s): nothing to get wrong.
            query = [x for x in op.get("parameters", []) if x["in"] == "query"]
            if query or op.get("requestBody"):
                found.append((method.upper(), path, GenerationMode.NEGATIVE))
    return found


def with_real_ids(case: schemathesis.Case, ids: dict[str, str]) -> None:
    """Ids of objects that exist, so that valid requests also reach their 200s."""
    for name in case.path_parameters or {}:
        if name in ids and case.method != "DELETE":  # the objects must stay for the others
            case.path_parameters[name] = ids[name]
    if isinstance(case.body, dict) and "input_file_id" in case.body:
        case.body["input_file_id"] = ids["input_file_id"]
    if isinstance(case.body, dict) and "file" in case.body:  # an upload: a valid batch file
        case.body["file"] = ids["file"]


@pytest.mark.parametrize(("method", "path", "mode"), cases())
def test_every_operation_conforms_to_the_document(api_schema, fuzzer, method, path, mode):
    # schemathesis's strategies under plain hypothesis (its pytest plugin does not run on this
    # pytest); the key is fixed, so negative cases get the request itself wrong, not the key.
    operation = api_schema[path][method]
    auth = {"Authorization": f"Bearer {fuzzer.key}"}
    strategy = operation.as_strategy(generation_mode=mode, headers=auth)

    @hypothesis.seed(SEED)
    @hypothesis.settings(
        max_examples=MAX_EXAMPLES,
        database=None,
        deadline=None,
        phases=[hypothesis.Phase.generate],
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(case=strategy, real_ids=hypothesis.strategies.booleans())
    def conforms(case: schemathesis.Case, real_ids: bool) -> None:
        if real_ids and mode is GenerationMode.POSITIVE:
            with_real_ids(case, fuzzer.ids)
        case.call_and_validate(headers=auth, checks=CHECKS)

    conforms()
