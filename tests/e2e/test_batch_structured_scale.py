# Issue 38's batch bar: a batch file of 1,000 json_schema lines (nested objects, arrays, enums,
# required fields) through a real `fleetlm serve` completes with 1,000 outputs that validate
# against their schemas. Small bounded schemas (tests/e2e/structured_schemas.py) on the
# random-weight "tiny" preset, where only the grammar keeps an output valid; a server that runs
# many lines at once, so this takes about 1.5 minutes on a shared 2-core CPU.
from __future__ import annotations

import json

import jsonschema
import pytest

from tests.e2e.batches.conftest import chat_line, read_lines, submit, wait_batch
from tests.e2e.conftest import start_server
from tests.e2e.structured_schemas import MAX_TOKENS, SMALL_SCHEMAS

pytestmark = pytest.mark.timeout(600)

NUM_LINES = 1000
SCALE_ENV = {
    "FLEETLM_BATCH_PUMP_INTERVAL_S": "0.2",
    "FLEETLM_BATCH_MAX_INFLIGHT": "256",
    "FLEETLM_BATCH_MAX_WAITING": "128",
    "FLEETLM_WORKER_MAX_WAITING": "128",
    "FLEETLM_BATCH_MIN_FREE_KV": "0",
    # A CPU step is far above the GPU's 40 ms TPOT target: let the worker batch what it has.
    "FLEETLM_TPOT_TARGET_S": "5",
}


@pytest.fixture(scope="module")
def batch_server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("batch-scale") / "data", workers=None, env=SCALE_ENV)
    yield srv
    assert srv.stop() == 0, srv.log()


def test_a_thousand_json_schema_lines_all_validate(batch_server):
    client = batch_server.openai()
    lines = [
        chat_line(
            f"line-{i}", content=f"record {i}", max_tokens=MAX_TOKENS, temperature=1.0, seed=i,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": f"s{i % len(SMALL_SCHEMAS)}",
                                "schema": SMALL_SCHEMAS[i % len(SMALL_SCHEMAS)], "strict": True},
            },
        )
        for i in range(NUM_LINES)
    ]  # fmt: skip
    batch = wait_batch(client, submit(client, lines).id, timeout_s=500)
    assert batch.status == "completed", batch
    assert batch.request_counts.completed == NUM_LINES and batch.request_counts.failed == 0
    out = read_lines(client, batch.output_file_id)
    assert sorted(x["custom_id"] for x in out) == sorted(x["custom_id"] for x in lines)
    for line in out:
        i = int(line["custom_id"].removeprefix("line-"))
        response = line["response"]
        assert response["status_code"] == 200
        choice = response["body"]["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        jsonschema.validate(
            json.loads(choice["message"]["content"]), SMALL_SCHEMAS[i % len(SMALL_SCHEMAS)]
        )
        assert response["body"]["usage"]["completion_tokens"] > 0
