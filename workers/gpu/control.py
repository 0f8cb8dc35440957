# A worker's side of the control commands (service/control.py). A thread of its own blocks on the
# worker's control list and queues what arrives; the step loop runs the queued commands between
# two steps (run_pending), because the engine is not thread-safe, and pushes each reply. The loop
# pays two attribute checks per turn; an idle worker answers within its queue-read block (~0.5 s).
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import redis

from engine import LLMEngine
from service import streams as p
from service.control import ControlCommand, ControlReply
from service.settings import Settings
from workers.gpu.profiling import StepProfiler

log = logging.getLogger("fleetlm.worker")

_BLOCK_S = 1  # how long one BLPOP waits before the thread looks at the stop flag again


class WorkerControl:
    def __init__(
        self, engine: LLMEngine, settings: Settings, redis_url: str, worker_id: str
    ) -> None:
        self.worker_id = worker_id
        self.redis = redis.Redis.from_url(redis_url, decode_responses=True)
        self.engine = engine
        self.profiler = StepProfiler(
            settings.profile_dir or settings.data_dir / "profiles",
            worker_id,
            engine.device,
            settings.profile_max_steps,
        )
        self.handlers: dict[str, Callable[[], dict[str, Any]]] = {
            "reset_prefix_cache": lambda: {"freed_blocks": engine.reset_prefix_cache()},
            "start_profile": self.profiler.start,
            "stop_profile": self.profiler.stop,
        }
        self._pending: deque[ControlCommand] = deque()
        self._stopping = threading.Event()

    def start(self, stopping: threading.Event) -> None:
        self._stopping = stopping
        threading.Thread(target=self._listen, name="control", daemon=True).start()

    def _listen(self) -> None:
        key = p.control_key(self.worker_id)
        while not self._stopping.is_set():
            try:
                item = self.redis.blpop([key], timeout=_BLOCK_S)
            except redis.RedisError as exc:
                log.warning("control list unreadable: %s", exc)
                self._stopping.wait(_BLOCK_S)
                continue
            if item is not None:
                self._pending.append(ControlCommand.decode(item[1]))

    def run_pending(self) -> None:
        """On the step loop's thread, between two steps."""
        if self.profiler.recording and self.engine.has_unfinished():
            self.profiler.step()  # a step is about to run
        while self._pending:
            command = self._pending.popleft()
            if time.time() > command.deadline:
                log.info("dropped %s: its caller stopped waiting", command.command)
                continue
            try:
                reply = ControlReply(self.worker_id, True, self.handlers[command.command]())
                log.info("control: %s %s", command.command, reply.result)
            except Exception as exc:  # the reply says why; the worker goes on serving
                log.exception("control command %s failed", command.command)
                reply = ControlReply(self.worker_id, False, error=f"{type(exc).__name__}: {exc}")
            ttl = max(1, int(command.deadline - time.time()) + 1)
            pipe = self.redis.pipeline(transaction=False)
            pipe.lpush(command.reply_to, reply.encode())
            pipe.expire(command.reply_to, ttl)
            try:
                pipe.execute()
            except redis.RedisError as exc:
                log.warning("control reply lost: %s", exc)

    def close(self) -> None:
        """A profile still running when the worker stops is written all the same."""
        if self.profiler.recording:
            self.profiler.stop()
