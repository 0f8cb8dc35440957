# `fleetlm serve`: everything on one machine. Starts embedded Redis/Postgres when no URL is set,
# applies the migrations, ensures a demo tenant key and an admin key, then supervises the API
# processes (fleetlm/api_processes.py: several on one port, sharing its socket), one
# worker per visible GPU (one CPU worker when none), Celery and the metering writer, restarting a
# child that dies, and the embedded Redis and Postgres the same way. Ctrl-C / SIGTERM drains the
# API and the workers together (in-flight work finishes until drain_timeout_s, the API relaying
# it), then stops Celery and the writer (which writes what the workers metered last), then the
# embedded services: it exits within drain_timeout_s plus a few seconds.
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fleetlm import serve_progress as progress
from fleetlm.api_processes import ApiListeners, num_api_processes, open_listeners
from fleetlm.worker_cmd import add_engine_flags, engine_flag_values

if TYPE_CHECKING:
    from service.embedded import EmbeddedServices
    from service.settings import Settings

MAX_RESTARTS_PER_MINUTE = 5
DRAIN_GRACE_S = 10.0  # past drain_timeout_s, a child that has not exited is killed


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run everything: embedded services, API and workers")
    p.add_argument("--data-dir", type=Path, default=None, help="default ./.fleetlm")
    p.add_argument("--model", default=None, help="HF checkpoint directory or preset name")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--workers", type=int, default=None,
                   help="default: one per tensor-parallel group of visible GPUs, or 1")  # fmt: skip
    add_engine_flags(p)
    p.set_defaults(func=run)


def count_gpus() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def ensure_demo_key(
    database_url: str, data_dir: Path, *, tenant: str = "demo", admin: bool = False
) -> str:
    """The demo tenant's key (or the operator's admin key): the one in <data-dir>/<tenant>-key
    while it is still valid."""
    from metering.db import make_engine, make_sessionmaker, transaction
    from metering.keys import create_api_key, find_principal, get_or_create_tenant

    path = data_dir / f"{tenant}-key"
    engine = make_engine(database_url)
    try:
        with transaction(make_sessionmaker(engine)) as session:
            if path.exists():
                key = path.read_text().strip()
                found = find_principal(session, key)
                if found is not None and found.is_admin == admin:
                    return key
            key = create_api_key(session, get_or_create_tenant(session, tenant), admin=admin)
    finally:
        engine.dispose()
    path.write_text(key + "\n")
    path.chmod(0o600)
    return key


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    restarts: list[float] | None = None
    pass_fds: tuple[int, ...] = ()  # inherited sockets (the API's listeners)
    on_exit: Callable[[int], None] | None = None  # called with the pid of a process that died

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            pass_fds=self.pass_fds,
        )

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, deadline: float) -> None:
        """Until it exits, or killed at the (monotonic) deadline."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _wait_healthy(url: str, child: Child, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child.proc is not None and child.proc.poll() is not None:
            raise SystemExit(f"fleetlm serve: the API exited with {child.proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"fleetlm serve: the API did not answer on {url} in {timeout_s:.0f}s")


def _settings(args: argparse.Namespace) -> Settings:
    from service.settings import Settings

    flags = {"model": args.model, "host": args.host, "port": args.port, "data_dir": args.data_dir}
    flags |= engine_flag_values(args)
    return Settings(**{k: v for k, v in flags.items() if v is not None})


@dataclass
class StopRequest:
    # A plain flag: a signal handler that took an Event's lock could deadlock its own thread.
    requested: bool = False


def _stop_on_signals() -> StopRequest:
    stop = StopRequest()

    def on_signal(*_: object) -> None:
        stop.requested = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return stop


def child_env(redis_url: str, database_url: str) -> dict[str, str]:
    return {**os.environ, "REDIS_URL": redis_url, "DATABASE_URL": database_url}


def cpu_torch_threads(settings: Settings, num_workers: int) -> tuple[int, str]:
    """CPU workers' torch threads (workers/gpu/torch_threads.py) and where the number comes from."""
    from workers.gpu.torch_threads import RESERVED_CORES, cpu_worker_threads, usable_cores

    if settings.torch_threads:
        return settings.torch_threads, "FLEETLM_TORCH_THREADS"
    cores = usable_cores()
    threads = cpu_worker_threads(num_workers, cores)
    why = f"{cores} core(s), {RESERVED_CORES} left for the API and services"
    return threads, f"{why}; FLEETLM_TORCH_THREADS overrides"


def _children(
    args: argparse.Namespace,
    settings: Settings,
    env: dict[str, str],
    api: ApiListeners | None = None,  # None: one API process that binds the port itself
) -> tuple[list[Child], str]:
    """The API processes first, then the workers, Celery, and the metering writer last. On the
    way out the API and the workers drain together, then the rest stop (the writer writes what
    the workers metered). Also says what the workers run on."""
    from workers.gpu.tp_group import visible_devices, worker_gpu_groups

    cli = [sys.executable, "-m", "fleetlm.cli"]
    num_api = api.num_processes if api else 1
    children = [
        Child(
            "api" if num_api == 1 else f"api-{i}",
            [*cli, "api", *(api.argv() if api else [])],
            api.env(env) if api else env,
            pass_fds=api.fds if api else (),
            on_exit=api.process_exited if api else None,
        )
        for i in range(num_api)
    ]
    num_gpus = count_gpus()
    # A worker is a tensor-parallel group: rank 0's process, which starts the other ranks.
    try:
        groups = worker_gpu_groups(num_gpus, settings.tensor_parallel_size, args.workers)
    except ValueError as exc:
        raise SystemExit(f"fleetlm serve: {exc}") from None
    num_workers = len(groups)
    on_cpu = settings.device == "cpu" or (settings.device == "auto" and not num_gpus)
    processes = num_workers * settings.tensor_parallel_size  # every rank is a process
    threads, why = cpu_torch_threads(settings, processes) if on_cpu else (0, "")
    workers = f"{num_workers} {'CPU' if on_cpu else 'GPU'} worker(s)"
    if settings.tensor_parallel_size > 1:
        workers += f" of {settings.tensor_parallel_size} ranks"
    if on_cpu and num_workers:
        workers += f", {threads} torch thread(s) each ({why})"
    for i, gpus in enumerate(groups):
        worker_env = dict(env)
        if gpus:
            worker_env["CUDA_VISIBLE_DEVICES"] = visible_devices(gpus)
        if on_cpu:
            worker_env["FLEETLM_TORCH_THREADS"] = str(threads)
        if settings.worker_metrics_port:
            worker_env["FLEETLM_WORKER_METRICS_PORT"] = str(settings.worker_metrics_port + i)
        children.append(Child(f"worker-{i}", [*cli, "worker"], worker_env))
    # Batch control plane (docs/batches.md); pidfiles let tests and operators find it.
    for role in ("worker", "beat"):
        pidfile = str(settings.data_dir.resolve() / f"celery-{role}.pid")
        argv = [*cli, "celery", role, "--pidfile", pidfile]
        children.append(Child(f"celery-{role}", argv, env))
    children.append(Child("metering", [*cli, "metering"], env))
    return children, workers


def _supervise(
    children: list[Child],
    services: EmbeddedServices,
    stop: StopRequest,
    milestones: progress.Milestones,
) -> int:
    """Restarts a child or an embedded service that dies, until told to stop (0) or one keeps
    dying (1); says when Celery is up and when the first worker is live."""
    service_restarts: dict[str, list[float]] = {}
    while not stop.requested:
        time.sleep(0.2)
        milestones.poll()
        try:
            restarted = services.restart_dead()
        except Exception as exc:  # a restart that failed is tried again next tick
            print(f"fleetlm: restarting an embedded service failed: {exc}", file=sys.stderr)
            restarted = []
        for name in restarted:
            now = time.monotonic()
            times = [t for t in service_restarts.get(name, []) if now - t < 60] + [now]
            service_restarts[name] = times
            print(f"fleetlm: embedded {name} exited; restarted", file=sys.stderr, flush=True)
            if len(times) > MAX_RESTARTS_PER_MINUTE:
                print(f"fleetlm: embedded {name} keeps dying; stopping", file=sys.stderr)
                return 1
        for child in children:
            if stop.requested or child.proc is None or child.proc.poll() is None:
                continue
            now = time.monotonic()
            child.restarts = [t for t in (child.restarts or []) if now - t < 60] + [now]
            if len(child.restarts) > MAX_RESTARTS_PER_MINUTE:
                print(f"fleetlm: {child.name} keeps dying; stopping", file=sys.stderr)
                return 1
            print(
                f"fleetlm: {child.name} exited ({child.proc.returncode}); restarting",
                file=sys.stderr,
                flush=True,
            )
            if child.on_exit is not None:
                child.on_exit(child.proc.pid)
            child.start()
    return 0


def _start_services(services: EmbeddedServices, settings: Settings, data_dir: Path) -> None:
    """The embedded Redis and Postgres where no URL is set, one line each."""
    if settings.redis_url:
        progress.say("Redis: REDIS_URL")
    else:
        with progress.part(f"Redis (embedded, {data_dir / 'redis'})"):
            services.start(redis=True, postgres=False)
    if settings.database_url:
        progress.say("Postgres: DATABASE_URL")
    else:
        first = "" if (data_dir / "postgres").exists() else "; a first start creates it"
        with progress.part(f"Postgres (embedded, {data_dir / 'postgres'}{first})"):
            services.start(redis=False, postgres=True)


def run(args: argparse.Namespace) -> int:
    from fleetlm.migrate_cmd import upgrade
    from service.embedded import EmbeddedServices

    settings = _settings(args)
    data_dir = settings.data_dir.resolve()
    stop = _stop_on_signals()
    services = EmbeddedServices(data_dir)
    children: list[Child] = []
    api: ApiListeners | None = None
    try:
        _start_services(services, settings, data_dir)
        redis_url = settings.redis_url or services.redis_url
        database_url = settings.database_url or services.database_url
        with progress.part("migrations", done="applied"):
            upgrade(database_url)
        key = ensure_demo_key(database_url, data_dir)
        ensure_demo_key(database_url, data_dir, tenant="operator", admin=True)

        env = child_env(redis_url, database_url)
        env.update(
            FLEETLM_MODEL=settings.model,
            FLEETLM_HOST=settings.host,
            FLEETLM_PORT=str(settings.port),
            FLEETLM_DATA_DIR=str(data_dir),
        )
        env.update({f"FLEETLM_{k.upper()}": str(v) for k, v in engine_flag_values(args).items()})
        try:
            api = open_listeners(settings, data_dir, num_api_processes(settings))
        except (OSError, ValueError) as exc:
            raise SystemExit(f"fleetlm serve: cannot listen on {settings.port}: {exc}") from None
        children, workers = _children(args, settings, env, api)
        progress.say(f"starting {api.num_processes} API process(es), {workers}")
        progress.say("starting the Celery worker and beat (batch jobs) and the metering writer")
        for child in children:
            child.start()
        base = f"http://{settings.host}:{settings.port}"
        _wait_healthy(base, children[0], timeout_s=120)
        progress.say(f"API up: serving {settings.model_name} at {base}/v1 (/health answers)")
        progress.say(f"API key {key} (also in {data_dir / 'demo-key'})")
        progress.say(f"admin key in {data_dir / 'operator-key'}")
        pidfiles = [data_dir / f"celery-{role}.pid" for role in ("worker", "beat")]
        milestones = progress.Milestones([progress.celery_up(pidfiles), progress.ready(base)])
        return _supervise(children, services, stop, milestones)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        # The API and the workers drain at once (each ends what is left at drain_timeout_s);
        # then Celery, and the writer last, so it writes what the workers metered.
        serving = [c for c in children if c.name.startswith(("api", "worker-"))]
        for child in serving:
            child.terminate()
        deadline = time.monotonic() + settings.drain_timeout_s + DRAIN_GRACE_S
        for child in serving:
            child.wait(deadline)
        rest = [c for c in children if c not in serving]
        for child in rest:
            child.terminate()
        deadline = time.monotonic() + DRAIN_GRACE_S
        for child in rest:
            child.wait(deadline)
        if api is not None:
            api.close()
        services.stop()
        print("fleetlm: stopped", flush=True)
