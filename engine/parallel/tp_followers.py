# The processes of a tensor-parallel engine. The engine's own process is rank 0 (scheduler,
# sampling, the caller's API); start_tensor_parallel() starts ranks 1..N-1 as child processes
# (`python -m engine.parallel.tp_followers`), each building its shard of the model through the same
# build_runner and then following rank 0's steps (ModelRunner.follow). Liveness both ways:
#   a follower that exits while the group runs takes rank 0 down (its next collective would
#   wait forever), so a supervisor restarts the whole group;
#   a follower whose parent (rank 0) is gone exits by itself within a second.
# The engine's shutdown() releases the followers from their loop and waits for them.
from __future__ import annotations

import argparse
import atexit
import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.parallel.tensor_parallel import SINGLE, TensorParallel, init_tensor_parallel

log = logging.getLogger("fleetlm.engine")
PARENT_POLL_S = 1.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Followers:
    """Rank 0's handle on ranks 1..N-1."""

    def __init__(self, config: EngineConfig, device: torch.device) -> None:
        self.size = config.tensor_parallel_size
        # Intra-op threads: rank 0's (a GPU worker sets 1); CPU ranks share the cores.
        threads = torch.get_num_threads()
        self.threads = threads if device.type == "cuda" else max(1, threads // self.size)
        self.port = _free_port()
        self.closing = False
        root = str(Path(__file__).resolve().parents[1])  # where the followers import `engine`
        path = os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])
        env = {**os.environ, "PYTHONPATH": path}
        self.procs = [self._spawn(config, rank, env) for rank in range(1, self.size)]
        atexit.register(self.kill)
        threading.Thread(target=self._watch, name="tp-followers", daemon=True).start()

    def _spawn(self, config: EngineConfig, rank: int, env: dict[str, str]) -> subprocess.Popen:
        argv = [
            sys.executable, "-m", "engine.parallel.tp_followers", "--rank", str(rank),
            "--size", str(self.size), "--port", str(self.port), "--parent-pid", str(os.getpid()),
            "--threads", str(self.threads),
            "--config", json.dumps(dataclasses.asdict(config)),
        ]  # fmt: skip
        return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)

    def _watch(self) -> None:
        while not self.closing:
            for rank, proc in enumerate(self.procs, start=1):
                code = proc.poll()
                if code is not None and not self.closing:
                    log.critical(
                        "tensor-parallel rank %d exited (code %s); this process cannot step "
                        "without it and exits too", rank, code,
                    )  # fmt: skip
                    self.kill()
                    os._exit(70)
            time.sleep(0.2)

    def stop(self, release: Callable[[], None], timeout_s: float = 30.0) -> None:
        """`release` tells the followers to leave their loop (rank 0's last broadcast); then
        wait for them. Marked closing first: their exits are expected from here on."""
        self.closing = True
        atexit.unregister(self.kill)
        release()
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def kill(self) -> None:
        self.closing = True
        atexit.unregister(self.kill)
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def start_tensor_parallel(
    config: EngineConfig, device: torch.device
) -> tuple[TensorParallel, Followers | None]:
    """Rank 0: start the followers and join their group (SINGLE, None with one rank)."""
    if config.tensor_parallel_size == 1:
        return SINGLE, None
    followers = Followers(config, device)
    try:
        return init_tensor_parallel(0, followers.size, device, followers.port), followers
    except BaseException:
        followers.kill()
        raise


# -- a follower process ---------------------------------------------------------------------


def _exit_with_parent(parent_pid: int) -> None:
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(0)  # rank 0 is gone: nothing will ever be stepped again

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    from engine.models.config import resolve_model_config
    from engine.runner.runner_setup import build_runner, resolve_device, resolve_dtype

    p = argparse.ArgumentParser(description="a tensor-parallel follower rank (internal)")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--parent-pid", type=int, required=True)
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (rank 0's)")
    p.add_argument("--config", required=True, help="the EngineConfig as JSON")
    args = p.parse_args(argv)
    _exit_with_parent(args.parent_pid)
    if args.threads:
        torch.set_num_threads(args.threads)
    config = EngineConfig(**json.loads(args.config))
    model_config = resolve_model_config(config.model)
    device = resolve_device(config.device, args.rank, args.size)
    dtype = resolve_dtype(config.dtype, model_config.dtype, device)
    tp = init_tensor_parallel(args.rank, args.size, device, args.port)
    runner = build_runner(config, model_config, device, dtype, tp)
    runner.follow()
    tp.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
