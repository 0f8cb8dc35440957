# The worker's per-step timing: the engine's step trace (engine/runner/step_trace.py) plus what the
# worker does around each step — its Redis round trip (built and sent while the step is on the
# GPU), applying what it read (cancels, admissions), the whole loop turn, and time spent in
# Python's garbage collector. `fleetlm bench serve` lines these rows up with the bare engine's.
#
# With a trace directory set (FLEETLM_WORKER_STEP_TRACE_DIR), rows are appended about once a
# second to <dir>/steps-<worker id>.f64 (float64, row-major) beside a JSON header naming the
# columns; read them back with read_step_trace().
from __future__ import annotations

import gc
import json
import time
from pathlib import Path

import numpy as np

WORKER_FIELDS = (
    # The round trip that ran while this step was on the GPU (publishing the previous step):
    "exchange_build_s",  # building the Redis pipeline
    "exchange_io_s",  # sending it and reading the replies
    "apply_s",  # applying what it read after this step: cancels, new requests
    "loop_s",  # the whole loop turn: step + exchange + admission
    "gc_s",  # Python garbage collection during the loop turn
    # The intake of that round trip (workers/gpu/intake_budget.py): why the worker took what it
    # took, for lining admission's forecasts up with the engine's queue.
    "max_running",  # the seats the TPOT target allows
    "room",  # queue entries it offered to take
    "taken",  # queue entries it took
    "seat_over",  # interactive requests held beyond the seats (negative: seats free)
    "mean_output",  # the mean output of its last finished requests
    "mean_uncached_prompt",  # ... and their mean uncached prompt
    "price_scale",  # the step prices' measured / predicted turn (workers/gpu/step_prices.py)
)
FLUSH_INTERVAL_S = 1.0


class StepTiming:
    def __init__(self, engine, worker_id: str, trace_dir: Path | None) -> None:
        self.trace = engine.enable_step_trace(capacity=1 << 16, extra_fields=WORKER_FIELDS)
        self._gc_s = 0.0
        self._gc_started = 0.0
        gc.callbacks.append(self._on_gc)
        self._path: Path | None = None
        self._flushed = 0
        self._last_flush = time.monotonic()
        if trace_dir is not None:
            trace_dir = Path(trace_dir)
            trace_dir.mkdir(parents=True, exist_ok=True)
            self._path = trace_dir / f"steps-{worker_id}.f64"
            self._path.unlink(missing_ok=True)
            header = {"fields": list(self.trace.fields), "worker_id": worker_id}
            self._path.with_suffix(".json").write_text(json.dumps(header))

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self._gc_s += time.perf_counter() - self._gc_started

    def add(self, row: int, **values: float) -> None:
        if row >= 0:
            self.trace.update(row, **values)

    def end_loop(self, row: int, loop_started: float) -> None:
        if row >= 0:
            self.trace.update(row, loop_s=time.perf_counter() - loop_started, gc_s=self._gc_s)
        self._gc_s = 0.0
        if self._path is not None and time.monotonic() - self._last_flush > FLUSH_INTERVAL_S:
            self.flush()

    def flush(self, force: bool = False) -> None:
        """Append the rows recorded since the last flush (the newest row stays until the next
        turn, so its worker fields are complete; all of them when forced)."""
        if self._path is None:
            return
        self._last_flush = time.monotonic()
        end = self.trace.num_recorded if force else self.trace.num_recorded - 1
        first = max(self._flushed, self.trace.num_recorded - self.trace.capacity)
        if end <= first:
            return
        rows = np.stack([self.trace.row(i) for i in range(first, end)])
        with self._path.open("ab") as f:
            f.write(rows.astype(np.float64).tobytes())
        self._flushed = end

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)


def read_step_trace(path: Path) -> dict[str, np.ndarray]:
    """Columns of a worker's trace file (see the header above)."""
    path = Path(path)
    fields = json.loads(path.with_suffix(".json").read_text())["fields"]
    data = np.fromfile(path, dtype=np.float64)
    rows = data[: len(data) - len(data) % len(fields)].reshape(-1, len(fields))
    return {name: rows[:, i] for i, name in enumerate(fields)}
