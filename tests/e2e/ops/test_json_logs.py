# With FLEETLM_LOG_FORMAT=json every process logs one JSON object per line, and one request id
# can be followed from the API's admission to the worker that finished it and to its usage row.
from __future__ import annotations

import json

from tests.e2e.conftest import wait_until


def _records(fleet) -> list[dict]:
    out = []
    for line in fleet.log().splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))  # a malformed line fails the test here
    return out


def test_request_id_is_followed_across_processes(fleet):
    r = fleet.openai().chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "trace me"}], max_tokens=3
    )
    rid = r.headers["x-request-id"]

    def both_logged():
        mine = [x for x in _records(fleet) if x.get("request_id") == rid]
        return (
            mine if {x["msg"] for x in mine} >= {"request admitted", "request finished"} else None
        )

    mine = wait_until(both_logged, 20, "the API and worker log lines of one request", 0.2)
    by_msg = {x["msg"]: x for x in mine}
    assert by_msg["request admitted"]["process"] == "api"
    assert by_msg["request finished"]["process"].startswith("worker")
    assert by_msg["request finished"]["status"] == "length"  # max_tokens 3 reached
    assert all({"ts", "level", "logger", "pid"} <= set(x) for x in mine)
    assert len(fleet.usage_rows([rid])) == 1  # the metering writer keyed it by the same id
