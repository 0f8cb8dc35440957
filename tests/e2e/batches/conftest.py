# One `fleetlm serve` (embedded Redis + Postgres, tiny model on CPU, Celery worker and beat) for
# the batch tests, with fast pump/sweep settings and a 10 s completion window for expiry.
from __future__ import annotations

import io
import json
import time

import pytest

from tests.e2e.conftest import start_server

BATCH_ENV = {
    "FLEETLM_BATCH_PUMP_INTERVAL_S": "0.2",
    "FLEETLM_BATCH_STALE_S": "3",
    "FLEETLM_BATCH_SWEEP_S": "1",
    "FLEETLM_BATCH_MAX_INFLIGHT": "48",
    "FLEETLM_CELERY_VISIBILITY_TIMEOUT_S": "30",
    "FLEETLM_BATCH_COMPLETION_WINDOWS": '["24h", "8s"]',
    # Two sequences at a time, and a worker that takes batch work into its engine freely, so a
    # batch backlog builds up in the engine's waiting queue, where priority decides the order.
    "FLEETLM_MAX_NUM_SEQS": "2",
    "FLEETLM_WORKER_MAX_WAITING": "64",
    "FLEETLM_WORKER_MAX_HELD": "64",
    "FLEETLM_BATCH_MAX_WAITING": "64",
}
FINAL = ("completed", "failed", "expired", "cancelled")


@pytest.fixture(scope="package")
def server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("batches") / "data", workers=None, env=BATCH_ENV)
    yield srv
    srv.stop()


def chat_line(custom_id: str, content: str = "hello", max_tokens: int = 4, **extra) -> dict:
    body = {"model": "tiny", "messages": [{"role": "user", "content": content}]}
    body |= {"max_tokens": max_tokens, "temperature": 0, **extra}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def jsonl(lines: list[dict]) -> bytes:
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


def submit(client, lines: list[dict], window: str = "24h"):
    f = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    return client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window=window
    )


def wait_batch(client, batch_id: str, timeout_s: float = 60, until=None):
    until = until or (lambda b: b.status in FINAL)
    deadline = time.monotonic() + timeout_s
    while True:
        b = client.batches.retrieve(batch_id)
        if until(b):
            return b
        if time.monotonic() > deadline:
            raise AssertionError(f"batch {batch_id} still {b.status}: {b.request_counts}")
        time.sleep(0.2)


def read_lines(client, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines() if x]
