# A real `fleetlm serve` (embedded Redis + Postgres, tiny model on CPU) per test module, and
# helpers to start extra `fleetlm worker` processes against it.
from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis

from metering.records import METERING_STREAM, RequestRecord, decode_record
from tests.postgres_template import copy_postgres_template
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "fleetlm.cli"]

# Small, fast settings for 2 CPU cores; a dead worker is noticed after 3 s.
BASE_ENV = {
    "FLEETLM_MODEL": "tiny",
    "FLEETLM_NUM_KV_BLOCKS": "256",
    "FLEETLM_HEARTBEAT_INTERVAL_S": "0.5",
    "FLEETLM_WORKER_DEAD_AFTER_S": "3",
    "FLEETLM_NO_WORKER_TIMEOUT_S": "2",
    "FLEETLM_RELAY_POLL_S": "0.25",
    "FLEETLM_API_KEY_CACHE_S": "1",
    "FLEETLM_TORCH_THREADS": "1",  # the worker shares 2 cores with the API, Redis and pytest
    # A loose TPOT target: a worker runs whatever bursts a functional test sends at once (on 2
    # shared cores the default 40 ms target would hold back, and admission refuse, some of them:
    # that rule is what tests/faults/test_overload*.py check, on the default settings).
    "FLEETLM_TPOT_TARGET_S": "1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n: int, avoid: tuple[int, ...] = ()) -> int:
    """A port p with p .. p + n - 1 all free now and none of them in `avoid`. `fleetlm serve`
    gives worker i the port FLEETLM_WORKER_METRICS_PORT + i, and a worker that cannot bind its
    port exits at every restart. A free ephemeral port's neighbour may at any moment become an
    outgoing connection's local port (a Redis client's, for as long as it lives): so these come
    from below the kernel's ephemeral range, where no connection is given one."""
    low = 32768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(10000, max(10001, low - n))
        held: list[socket.socket] = []
        try:
            for port in range(base, base + n):
                if port in avoid:
                    raise OSError("avoided")
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports")


def service_env(extra: dict[str, str | None] | None = None) -> dict[str, str]:
    """The base settings, then `extra`; a None value leaves that setting at its default."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env = {k: v for k, v in env.items() if not k.startswith("FLEETLM_")}
    env.update(BASE_ENV)
    env.update(extra or {})
    env = {k: v for k, v in env.items() if v is not None}
    env["PYTHONPATH"] = str(ROOT)
    return env


@dataclass
class Server:
    data_dir: Path
    port: int
    proc: subprocess.Popen
    log_path: Path
    env: dict[str, str]
    workers: list[subprocess.Popen] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def key(self) -> str:
        return (self.data_dir / "demo-key").read_text().strip()

    @property
    def redis(self) -> redis.Redis:
        urls = json.loads((self.data_dir / "services.json").read_text())
        return redis.Redis.from_url(urls["redis_url"], decode_responses=True)

    @property
    def admin_key(self) -> str:
        return (self.data_dir / "operator-key").read_text().strip()

    @property
    def database_url(self) -> str:
        return json.loads((self.data_dir / "services.json").read_text())["database_url"]

    def cli(self, *args: str, timeout_s: float = 60) -> str:
        """Runs `fleetlm ARGS --data-dir <this server's>`; returns stdout."""
        out = subprocess.run(
            [*CLI, *args, "--data-dir", str(self.data_dir)],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        assert out.returncode == 0, f"fleetlm {' '.join(args)}: {out.stderr}"
        return out.stdout

    def create_tenant(self, name: str, *limit_flags: str) -> str:
        return json.loads(self.cli("tenants", "create", name, "--json", *limit_flags))["api_key"]

    def query(self, sql: str, **params):
        from sqlalchemy import text

        from metering.db import make_engine

        engine = make_engine(self.database_url)
        try:
            with engine.connect() as conn:
                return conn.execute(text(sql), params).all()
        finally:
            engine.dispose()

    def usage_rows(self, request_ids: list[str], timeout_s: float = 20.0) -> list:
        """The usage_records rows of these requests, once the writer has written all of them."""
        sql = "SELECT * FROM usage_records WHERE request_id = ANY(:ids)"

        from sqlalchemy.exc import OperationalError

        def all_written():
            try:
                rows = self.query(sql, ids=list(request_ids))
            except OperationalError:  # a restarted Postgres that is still starting up
                return None
            return rows if len({r.request_id for r in rows}) == len(set(request_ids)) else None

        return wait_until(all_written, timeout_s, "the usage rows", 0.2)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def openai(self, **kw):
        import openai

        kw.setdefault("timeout", 60)
        kw.setdefault("max_retries", 0)
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key=self.key, **kw)

    def workers_stats(self) -> list[dict]:
        r = httpx.get(
            self.base_url + "/internal/workers",
            headers={"Authorization": f"Bearer {self.admin_key}"},
            timeout=10,
        )
        r.raise_for_status()
        return r.json()["workers"]

    def usage_records(self) -> list[RequestRecord]:
        """Every request's record on the metering stream, decoded (busy records left out)."""
        records = [decode_record(f) for _, f in self.redis.xrange(METERING_STREAM)]
        return [r for r in records if isinstance(r, RequestRecord)]

    def usage_record(self, request_id: str, timeout_s: float = 15.0) -> RequestRecord:
        def find():
            return next((r for r in self.usage_records() if r.request_id == request_id), None)

        return wait_until(find, timeout_s, f"the usage record of {request_id}", 0.1)

    def start_worker(self, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.log_path, "a")  # noqa: SIM115 - the child keeps writing to it
        proc = subprocess.Popen(
            [*CLI, "worker", "--data-dir", str(self.data_dir)],
            env={**self.env, **(extra_env or {})},
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.workers.append(proc)
        return proc

    def stop(self) -> int:
        for proc in self.workers:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.workers:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            return -9


def start_server(data_dir: Path, *, workers: int | None, env: dict[str, str] | None = None):
    if not (data_dir / "postgres").exists():
        copy_postgres_template(data_dir)  # one initdb per session: see postgres_template.py
    port = free_port()
    full_env = service_env({**(env or {}), "FLEETLM_PORT": str(port)})
    log_path = data_dir.parent / f"{data_dir.name}-serve.log"
    argv = [*CLI, "serve", "--data-dir", str(data_dir)]
    if workers is not None:
        argv += ["--workers", str(workers)]
    log = open(log_path, "a")  # noqa: SIM115 - the child keeps writing to it
    proc = subprocess.Popen(
        argv, env=full_env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    server = Server(data_dir, port, proc, log_path, full_env)

    def up():
        if proc.poll() is not None:
            raise AssertionError(f"fleetlm serve exited {proc.returncode}:\n{server.log()}")
        try:
            r = httpx.get(server.base_url + ("/ready" if workers != 0 else "/health"), timeout=2)
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, 120, "fleetlm serve to become ready", 0.2)
    except AssertionError:
        server.stop()
        raise AssertionError(f"fleetlm serve did not become ready:\n{server.log()}") from None
    return server


@pytest.fixture(scope="package")
def server(tmp_path_factory):
    """One `fleetlm serve` with its default single CPU worker, shared by the package's tests."""
    srv = start_server(tmp_path_factory.mktemp("serve") / "data", workers=None)
    yield srv
    rc = srv.stop()
    assert rc == 0, f"fleetlm serve exited {rc} on SIGTERM:\n{srv.log()}"


@pytest.fixture(scope="package")
def shipped_server(tmp_path_factory):
    """One `fleetlm serve` of the shipped chat model (text a real model writes), shared by the
    package's tests that need one (structured outputs, vLLM extras, logprobs): starting one
    takes 20-40 s on a busy 2-core machine. float32, as HF parity compares (CPU's "auto")."""
    model = str(ROOT / "models" / "fleetlm-tiny-chat")
    env = {"FLEETLM_MODEL": model, "FLEETLM_DTYPE": "float32"}
    srv = start_server(tmp_path_factory.mktemp("shipped") / "data", workers=None, env=env)
    yield srv
    rc = srv.stop()
    assert rc == 0, f"fleetlm serve exited {rc} on SIGTERM:\n{srv.log()}"
