# `fleetlm serve`'s API processes. At load one Python process relays thousands of SSE chunks a
# second and its event loop becomes the queue every new request and every first token waits in
# (docs/benchmarks-log.md, run 9), so `serve` runs several on the one port: it binds the API and
# metrics sockets itself, once, and each API process inherits them and accepts from them (the
# kernel hands each new connection to one process that is waiting; a restarted process finds the
# port still bound). Their Prometheus series are written through prometheus_client's
# multiprocess mode into one directory, so a scrape of any of them reports the sum of all.
from __future__ import annotations

import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from service.settings import Settings

MAX_AUTO_PROCESSES = 4
CPUS_PER_PROCESS = 4


def num_api_processes(settings: Settings) -> int:
    """FLEETLM_API_PROCESSES, or one per four CPUs this process may use (at most four)."""
    if settings.api_processes:
        return settings.api_processes
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_AUTO_PROCESSES, cpus // CPUS_PER_PROCESS))


@dataclass
class ApiListeners:
    num_processes: int
    sockets: list[socket.socket]  # the API port's, then the metrics port's (kept open here)
    metrics_dir: Path | None  # prometheus_client's multiprocess directory (None: one process)

    @property
    def fds(self) -> tuple[int, ...]:
        return tuple(s.fileno() for s in self.sockets)

    def argv(self) -> list[str]:
        return ["--listen-fds", ",".join(str(fd) for fd in self.fds)]

    def env(self, base: dict[str, str]) -> dict[str, str]:
        if self.metrics_dir is None:
            return base
        return base | {"PROMETHEUS_MULTIPROC_DIR": str(self.metrics_dir)}

    def process_exited(self, pid: int) -> None:
        """A dead process's live gauges (open requests, draining) leave the sums."""
        if self.metrics_dir is not None:
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(pid, str(self.metrics_dir))

    def close(self) -> None:
        for s in self.sockets:
            s.close()


def open_listeners(settings: Settings, data_dir: Path, num_processes: int) -> ApiListeners:
    from api.server import bind_listeners

    metrics_dir = None
    if num_processes > 1:
        metrics_dir = data_dir / "api-metrics"
        shutil.rmtree(metrics_dir, ignore_errors=True)  # counters start at zero with the server
        metrics_dir.mkdir(parents=True)
    return ApiListeners(num_processes, bind_listeners(settings), metrics_dir)
