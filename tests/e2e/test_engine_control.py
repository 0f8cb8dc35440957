# vLLM's engine control endpoints on a real `fleetlm serve`: admin keys only; /reset_prefix_cache
# makes a repeated prompt miss the cache it hit before; /start_profile then /stop_profile leave a
# Chrome trace of the worker's engine steps under the data directory.
from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.timeout(120)

ENDPOINTS = ("/reset_prefix_cache", "/start_profile", "/stop_profile")


def _post(server, path: str, key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(server.base_url + path, headers=headers, timeout=60)


@pytest.mark.parametrize("path", ENDPOINTS)
def test_control_endpoints_need_an_admin_key(server, path):
    assert _post(server, path, None).status_code == 401
    r = _post(server, path, server.key)  # the demo tenant's key
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_key_required"


def test_reset_prefix_cache_makes_a_repeated_prompt_miss(server):
    system = f"[{uuid.uuid4().hex}] " + "You are a careful assistant. " * 20
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Hello"}]
    client = server.openai()

    def cached_tokens() -> int:
        out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
        return out.usage.prompt_tokens_details.cached_tokens

    cached_tokens()
    hit = cached_tokens()
    assert hit >= 256
    r = _post(server, "/reset_prefix_cache", server.admin_key)
    assert r.status_code == 200, r.text
    body = r.json()
    (worker,) = body["workers"]
    assert body["freed_blocks"] == worker["freed_blocks"] >= hit // 16
    assert cached_tokens() == 0
    assert cached_tokens() == hit  # cached again from the run after the reset


def test_a_profile_writes_a_trace_of_the_engine_steps(server):
    started = _post(server, "/start_profile", server.admin_key)
    assert started.status_code == 200, started.text
    assert [w["started"] for w in started.json()["workers"]] == [True]
    try:
        server.openai().completions.create(model="tiny", prompt="profile me", max_tokens=4)
    finally:
        stopped = _post(server, "/stop_profile", server.admin_key)
    assert stopped.status_code == 200, stopped.text
    (trace,) = stopped.json()["traces"]
    path = Path(trace)
    assert path.is_relative_to(server.data_dir.resolve() / "profiles")
    events = json.loads(path.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert any(name.startswith("aten::") for name in names if name)  # the model's operators
    again = _post(server, "/stop_profile", server.admin_key)  # nothing left to stop
    assert again.status_code == 409
