# How late an API process's event loop runs what is due, and what held it when it stalls.
#
# Everything an API process does waits in one queue, its event loop: a new request's admission,
# its enqueue, and every SSE chunk relayed to every open stream. Code that holds the loop (a CPU
# burst, a blocking call) delays all of them at once, and a client sees it as time to first
# token that no worker spent. Two parts:
# - a task that asks to wake every TICK_S and records how late it woke (the loop's lag) in
#   `fleetlm:api_event_loop_lag_seconds`;
# - a thread that looks every TICK_S at when the task last ran: while the loop has not ticked
#   for `stall_s` it is stalled, and the thread reads the loop thread's stack each time. A
#   stall is counted (`fleetlm:api_event_loop_stalls`) and logged at WARNING with how long it
#   lasted, where the loop was (the stack most of those reads saw), and how much of it was
#   Python's garbage collector running in the loop's thread (at most one line per LOG_EVERY_S:
#   the worst since the last).
#
# The thread needs the interpreter lock to look: a stall inside C code that holds it (a huge
# json.dumps) is seen when it ends, with the stack of whatever the loop runs next. Python code
# that holds the loop gives the lock up every switch interval (5 ms), and is caught in the act.
from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import logging
import sys
import threading
import time
import traceback
from collections import deque

from prometheus_client import Counter, Histogram

log = logging.getLogger("fleetlm.api")

TICK_S = 0.05
LOG_EVERY_S = 5.0
STACK_FRAMES = 6  # innermost frames logged as `where`
GC_KEPT = 256  # collections remembered for attributing a stall's time

LOOP_LAG = Histogram(
    "fleetlm:api_event_loop_lag_seconds",
    "How late the API process's event loop woke a task due every 50 ms.",
    registry=None,
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
LOOP_STALLS = Counter(
    "fleetlm:api_event_loop_stalls",
    "Times the API process's event loop did not run for FLEETLM_API_STALL_S or longer.",
    registry=None,
)


class LoopWatch:
    def __init__(self, stall_s: float) -> None:
        self.stall_s = stall_s
        self.last_tick = time.monotonic()
        self._loop_thread = threading.get_ident()
        self._task: asyncio.Task | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # the loop thread's stacks sampled during the stall being watched
        self._stall_wheres: list[str] = []
        self._worst: tuple[float, str, float] | None = None  # (seconds, where, gc) not logged
        self._logged_at = 0.0
        # the loop thread's garbage collections: (ended at, seconds), the last GC_KEPT
        self._collections: deque[tuple[float, float]] = deque(maxlen=GC_KEPT)
        self._gc_started = 0.0

    def start(self) -> None:
        """From the event loop's own thread."""
        self._loop_thread = threading.get_ident()
        self.last_tick = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._tick())
        if self.stall_s > 0:  # (the collections are only read to attribute a stall)
            gc.callbacks.append(self._on_gc)
            self._thread = threading.Thread(target=self._watch, name="loop-watch", daemon=True)
            self._thread.start()

    async def aclose(self) -> None:
        self._stop.set()
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_gc)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._thread is not None:
            self._thread.join(timeout=2 * TICK_S + 1)

    async def _tick(self) -> None:
        while True:
            due = time.monotonic() + TICK_S
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            LOOP_LAG.observe(max(0.0, now - due))
            self.last_tick = now

    def _on_gc(self, phase: str, info: dict) -> None:
        if threading.get_ident() != self._loop_thread:
            return
        now = time.monotonic()
        if phase == "start":
            self._gc_started = now
        else:
            self._collections.append((now, now - self._gc_started))

    def _watch(self) -> None:
        stall_start: float | None = None
        while not self._stop.wait(TICK_S):
            now = time.monotonic()
            last = self.last_tick
            if now - last >= self.stall_s:
                if stall_start != last:  # a new stall
                    stall_start = last
                    self._stall_wheres = []
                frame = sys._current_frames().get(self._loop_thread)
                if frame is not None:
                    self._stall_wheres.append(_where(frame))
                continue
            if stall_start is not None:  # it ticked again: the stall ended at `last`
                self._ended(stall_start, last)
                stall_start = None
            self._maybe_log(now)

    def _ended(self, start: float, end: float) -> None:
        LOOP_STALLS.inc()
        # Where it was held most of the samples: the last one alone may come after the holder
        # returned, when a busy machine ran this thread late (the loop not ticked yet).
        wheres = collections.Counter(self._stall_wheres)
        where = wheres.most_common(1)[0][0] if wheres else "?"  # (ties: the first seen)
        self._stall_wheres = []
        collected = sum(s for ended, s in list(self._collections) if start <= ended <= end)
        if self._worst is None or end - start > self._worst[0]:
            self._worst = (end - start, where, collected)

    def _maybe_log(self, now: float) -> None:
        if self._worst is None or now - self._logged_at < LOG_EVERY_S:
            return
        seconds, where, collected = self._worst
        self._worst, self._logged_at = None, now
        log.warning(
            "event loop stalled",
            extra={
                "stalled_ms": round(seconds * 1000, 1),
                "gc_ms": round(collected * 1000, 1),
                "where": where,
            },
        )


def _where(frame) -> str:
    """The innermost frames as `file:line:function` joined by '<' (no spaces: one log field)."""
    frames = reversed(traceback.extract_stack(frame)[-STACK_FRAMES:])
    return "<".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}:{f.name}" for f in frames)
