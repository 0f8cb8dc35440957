# `fleetlm serve` stops every child and embedded service on SIGTERM, and a second start on the
# same data directory reuses the data (demo key, database rows, Redis contents).
from __future__ import annotations

import json
import subprocess

import httpx
import psycopg
import pytest
import redis

from tests.e2e.conftest import CLI, ROOT, start_server

pytestmark = pytest.mark.timeout(180)


def test_stop_and_restart_reuse_the_data(tmp_path):
    data_dir = tmp_path / "data"
    first = start_server(data_dir, workers=0)
    urls = json.loads((data_dir / "services.json").read_text())
    key = first.key
    first.redis.set("fleetlm:test:kept", "yes")
    # `fleetlm migrate --data-dir` finds the running serve's Postgres; migrations are idempotent.
    subprocess.run(
        [*CLI, "migrate", "--data-dir", str(data_dir)],
        env=first.env,
        cwd=ROOT,
        check=True,
        timeout=60,
        capture_output=True,
    )

    assert first.stop() == 0, first.log()
    assert not (data_dir / "services.json").exists()
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(urls["redis_url"], socket_connect_timeout=2).ping()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(urls["database_url"], connect_timeout=2)
    with pytest.raises(httpx.ConnectError):
        httpx.get(first.base_url + "/health", timeout=2)

    second = start_server(data_dir, workers=0)
    try:
        assert second.key == key
        r = httpx.get(
            second.base_url + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10
        )
        assert r.status_code == 200
        assert second.redis.get("fleetlm:test:kept") == "yes"
    finally:
        assert second.stop() == 0, second.log()
