# Schemathesis over the app's own /openapi.json, in process (ASGI), with a tenant key: generated
# requests, valid and invalid, for every operation, under every check schemathesis has (its
# `--checks all`): zero 5xx, zero responses that the document does not describe (status, media
# type, body, headers, a 405's Allow), every schema-invalid request refused with a 4xx and every
# schema-valid one accepted. The one allowance: a 400 naming a field that the document marks
# `x-checked` (service/schemas/fields.py: a rule JSON Schema cannot state, such as "a token id of
# the model's vocabulary" or "a regex the grammar engine compiles"). A fixed number of examples
# per operation and a fixed seed keep it short and repeatable. The test plays the worker for its
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
from schemathesis.python.asgi import shutdown_lifespans
from schemathesis.specs.openapi.checks import RejectedPositiveData, positive_data_acceptance

from api.main import create_app
from engine.usage import RequestUsage
from metering.batches import create_batch
from metering.db import transaction
from metering.files import create_file
from metering.tenants import create_tenant
from service import streams as p
from service.events import encode_event
from service.queued_request import QueuedRequest
from service.schemas.fields import CHECKED
from tests.api.conftest import SETTINGS

pytestmark = pytest.mark.timeout(120)  # per operation and mode; about 5-15 s on a busy machine

MAX_EXAMPLES = 50  # per operation and generation mode
SEED = 18
# Postgres may take seconds to answer on a busy machine: an outage's 503 is the fault tests'
# subject (tests/faults/test_postgres_outage.py), not this one's.
FUZZ_SETTINGS = SETTINGS.model_copy(update={"database_timeout_s": 60.0})


def positive_data_accepted_as_documented(ctx, response, case) -> bool | None:
    """schemathesis's positive_data_acceptance, but for a 400 (OpenAI-shaped) that names a
    field whose rule the document states in `x-checked`."""
    try:
        return positive_data_acceptance(ctx, response, case)
    except RejectedPositiveData:
        if response.status_code == 400 and error_param(response) in checked_fields(case):
            return None
        raise


def error_param(response) -> str | None:
    body = json.loads(response.content)
    param = body["error"]["param"]  # the error body's shape is checked by the other checks
    return param.split(".")[0] if param else None


def checked_fields(case: schemathesis.Case) -> set[str]:
    """The request body's top-level fields that the document marks x-checked."""
    document = case.operation.schema.raw_schema
    content = case.operation.definition.raw.get("requestBody", {}).get("content", {})
    found = set()
    for media in content.values():
        ref = media.get("schema", {}).get("$ref", "")
        schema = document["components"]["schemas"].get(ref.rsplit("/", 1)[-1], {})
        found |= {n for n, p in schema.get("properties", {}).items() if CHECKED in p}
    return found


# Every check schemathesis has, positive_data_acceptance as above.
CHECKS = [
    positive_data_accepted_as_documented if check is positive_data_acceptance else check
    for check in schemathesis.checks.CHECKS.get_all()
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
            "usage": RequestUsage.from_json(counts).to_json(),
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
    app = create_app(FUZZ_SETTINGS, services.redis_url, services.database_url)
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
