# The embedded Redis of `fleetlm serve` requires its generated password: a local client without
# it can neither read the queues nor write to them, the password is kept in the data directory
# readable by its owner only and never appears on a command line, and every process serve
# started (API, worker, writer) works with it.
from __future__ import annotations

import stat
from pathlib import Path
from urllib.parse import urlparse

import psutil
import pytest
import redis

pytestmark = pytest.mark.timeout(180)


def test_the_embedded_redis_needs_the_generated_password(server):
    url = urlparse(_url(server))
    password_file = server.data_dir / "redis-password"
    password = password_file.read_text().strip()
    assert len(password) >= 32 and url.password == password
    for path in (password_file, server.data_dir / "services.json"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path

    anonymous = redis.Redis(host=url.hostname, port=url.port, socket_connect_timeout=5)
    with pytest.raises(redis.AuthenticationError):
        anonymous.xrange("fleetlm:q:interactive")
    with pytest.raises(redis.AuthenticationError):
        anonymous.xadd("fleetlm:q:interactive", {"r": "{}"})
    assert server.redis.ping()  # with the password

    # Acknowledged writes are on disk before the reply (everysec may reply before it wrote).
    assert server.redis.config_get("appendfsync") == {"appendfsync": "always"}
    assert server.redis.config_get("appendonly") == {"appendonly": "yes"}

    redis_pid = int(server.redis.info("server")["process_id"])
    assert password not in " ".join(psutil.Process(redis_pid).cmdline())
    # Everything serve started reaches Redis with it: a request goes through end to end.
    completion = server.openai().completions.create(
        model="tiny", prompt="hi", max_tokens=4, extra_body={"ignore_eos": True}
    )
    assert completion.usage.completion_tokens == 4
    assert server.usage_record(completion.id).counts["completion_tokens"] == 4


def _url(server) -> str:
    import json

    return json.loads((Path(server.data_dir) / "services.json").read_text())["redis_url"]
