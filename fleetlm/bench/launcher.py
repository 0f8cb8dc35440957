# `fleetlm bench serve --launch`: a real `fleetlm serve` in a scratch data directory (embedded
# Redis and Postgres, the API, one worker per GPU), with the workers' step traces switched on,
# started and stopped by the benchmark so the bare engine can have the GPU afterwards.
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

# key=value pairs of a text log line (service/logging_setup.py's TextFormatter)
_LOG_FIELD = re.compile(r"(\w+)=(\S+)")
ADMISSION_STAGES = ("admit_ms", "shed_ms", "reserve_ms", "enqueue_ms")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LaunchedServer:
    def __init__(
        self,
        model: str | None,
        *,
        data_dir: Path | None = None,
        env: dict[str, str] | None = None,
        ready_timeout_s: float = 600.0,
        log_path: Path | None = None,
        keep_logs: Path | None = None,
        workers: int | None = None,
    ) -> None:
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="fleetlm-bench-")).resolve()
        self.trace_dir = self.data_dir / "step-traces"
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.model = model
        self.extra_env = env or {}
        self.ready_timeout_s = ready_timeout_s
        self.log_path = log_path or self.data_dir / "serve.log"
        self.keep_logs = keep_logs  # copy serve.log and the step traces here on cleanup
        self.workers = workers  # `fleetlm serve --workers` (None: one per GPU, or one CPU worker)
        self.proc: subprocess.Popen | None = None

    def start(self) -> LaunchedServer:
        env = {
            **os.environ,
            "FLEETLM_DATA_DIR": str(self.data_dir),
            "FLEETLM_PORT": str(self.port),
            "FLEETLM_HOST": "127.0.0.1",
            "FLEETLM_WORKER_STEP_TRACE_DIR": str(self.trace_dir),
            **self.extra_env,
        }
        if self.model:
            env["FLEETLM_MODEL"] = self.model
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        argv = [sys.executable, "-m", "fleetlm.cli", "serve"]
        if self.workers is not None:
            argv += ["--workers", str(self.workers)]
        self.proc = subprocess.Popen(
            argv,
            env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        url = self.base_url.removesuffix("/v1") + "/ready"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"fleetlm serve exited with {self.proc.returncode}; the end of "
                    f"{self.log_path}:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200 and json.load(r).get("workers", 0) > 0:
                        return
            except (OSError, urllib.error.URLError, ValueError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(
            f"fleetlm serve not ready in {self.ready_timeout_s:.0f}s; the end of "
            f"{self.log_path}:\n{self.log_tail()}"
        )

    def log_tail(self, num_bytes: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-num_bytes:].decode(errors="replace")
        except OSError:
            return "(no log)"

    @property
    def api_key(self) -> str:
        return (self.data_dir / "demo-key").read_text().strip()

    @property
    def admin_key(self) -> str:
        return (self.data_dir / "operator-key").read_text().strip()

    def trace_files(self) -> list[Path]:
        return sorted(self.trace_dir.glob("steps-*.f64"))

    def _logged(self, message: str) -> list[tuple[str, dict[str, str]]]:
        """The serve log's lines carrying `message`, each with its key=value fields."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        return [(ln, dict(_LOG_FIELD.findall(ln))) for ln in text.splitlines() if message in ln]

    def admission_timings(self, request_ids: list[str]) -> dict[str, dict[str, float]]:
        """request id → where its time before the queue went (ms, api/generation.py's admitted
        log line: admit_ms since its enqueue stamp, shed_ms, reserve_ms, enqueue_ms)."""
        wanted = set(request_ids)
        found: dict[str, dict[str, float]] = {}
        for _, fields in self._logged("request admitted"):
            if fields.get("request_id") in wanted and "admit_ms" in fields:
                found[fields["request_id"]] = {
                    k: float(fields[k]) for k in ADMISSION_STAGES if k in fields
                }
        return found

    def loop_stalls(self, since: float) -> dict:
        """The API processes' event-loop stalls logged since `since` (time.time()): each line is
        the worst stall of up to 5 s (api/loop_watch.py), with where the loop was held."""
        lines = []
        for line, fields in self._logged("event loop stalled"):
            try:  # the text formatter's asctime: local time, to the millisecond
                at = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S"))
            except ValueError:
                continue
            if at + 1 >= since and "stalled_ms" in fields:
                gc_ms = float(fields.get("gc_ms", 0.0))
                lines.append((float(fields["stalled_ms"]), gc_ms, fields.get("where", "?")))
        worst = max(lines, default=(0.0, 0.0, None))
        return {
            "logged": len(lines),
            "worst_ms": worst[0],
            "worst_gc_ms": worst[1],  # the garbage collector's share of it
            "worst_where": worst[2],
        }

    def request_timings(self, request_ids: list[str], timeout_s: float = 20.0) -> dict:
        """request id → (queue_ms, ttft_ms) from the server's usage rows, waiting up to
        timeout_s for the metering writer to have written them all (what is there by then)."""
        from sqlalchemy import select

        from metering.db import make_engine
        from metering.models import UsageRecord
        from service.embedded import resolve_urls
        from service.settings import Settings

        if not request_ids:
            return {}
        _, database_url = resolve_urls(Settings(_env_file=None), self.data_dir)
        db = make_engine(database_url)
        query = select(UsageRecord.request_id, UsageRecord.queue_ms, UsageRecord.ttft_ms).where(
            UsageRecord.request_id.in_(request_ids)
        )
        found: dict = {}
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                with db.connect() as conn:
                    found = {rid: (q, t) for rid, q, t in conn.execute(query)}
                if len(found) >= len(set(request_ids)) or time.monotonic() > deadline:
                    return found
                time.sleep(0.5)
        finally:
            db.dispose()

    def stop(self, timeout_s: float = 120.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def cleanup(self) -> None:
        self.stop()
        if self.keep_logs is not None:
            self.keep_logs.mkdir(parents=True, exist_ok=True)
            for path in [self.log_path, *self.trace_dir.glob("steps-*")]:
                if path.exists():
                    shutil.copy2(path, self.keep_logs / path.name)
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> LaunchedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
