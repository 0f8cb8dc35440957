# One row per engine step, for benchmarks and the worker's own step timing: wall-clock phases,
# GPU time between CUDA events, and the step's shape (tokens, decodes, running, waiting). Rows
# live in preallocated numpy columns, so recording a step costs a few array stores, and a
# bounded trace keeps only the newest `capacity` rows (a ring).
#
# GPU time: the runner records a start and an end event around each step's device work. The end
# event of a plain step completes before the step's device-to-host copy returns, but a verify
# step records it after, so events are resolved lazily (event.query()) on later records or on
# read, never with a synchronisation on the step path. The GPU's idle time before a step is the
# interval from the previous step's end event to this one's start: near zero when the host
# queued the step before the GPU finished the previous one (overlapped scheduling).
from __future__ import annotations

import math
from collections import deque

import numpy as np

# Written by the engine for every step (seconds, counts).
ENGINE_FIELDS = (
    "start",  # time.time() when the step began
    "wall_s",  # the engine's own time in the step: begin_step + finish_step
    "schedule_s",  # scheduling (and drafting, when speculating), sync_s included
    "sync_s",  # of it: waiting for the GPU at an overlapped engine's sync step
    "prepare_s",  # batch packing + host-to-device copies
    "forward_s",  # launching the forward pass (graph replay or eager kernels)
    "read_ahead_s",  # constrained rows: waiting for the previous step's ids, feeding matchers
    "masks_s",  # constrained rows: filling, uploading and applying the grammar masks
    "sample_s",  # launching sampling and the device-to-host copy
    "wait_s",  # waiting for the device in finish_step
    "post_s",  # bookkeeping after the forward pass: new tokens, stops, detokenisation
    "host_s",  # the host's time to prepare the step: schedule_step + launch_step
    "gpu_s",  # device time from the step's start event to its end event (NaN on the CPU)
    "gpu_gap_s",  # GPU idle before the step: previous step's end event → this start (NaN: CPU)
    "overlapped",  # 1: launched before the previous step's tokens were on the host
    "num_tokens",
    "num_decodes",
    "num_seqs",
    "num_running",
    "num_waiting",
    "kv_usage",
    "kernel_compiles",  # Triton compilations during the step (each one stalls it)
    # the step's cost-model features (engine/core/step_cost.py StepFeatures) beside num_decodes
    # and num_tokens: a trace can refit the model offline (fleetlm/bench/schedule_sim.py)
    "decode_context",
    "prefill_pairs",
)


class StepTrace:
    def __init__(self, capacity: int = 1 << 18, extra_fields: tuple[str, ...] = ()) -> None:
        if capacity < 1:
            raise ValueError("capacity must be positive")
        self.fields = ENGINE_FIELDS + tuple(f for f in extra_fields if f not in ENGINE_FIELDS)
        self.capacity = capacity
        self._cols = {f: np.full(capacity, math.nan) for f in self.fields}
        self.num_recorded = 0  # rows ever recorded; row i lives at i % capacity
        # (row, start, end, the previous step's end or None) events
        self._pending: deque[tuple[int, object, object, object]] = deque()
        self._last_end: object = None  # the newest step's end event

    def record(self, **values: float) -> int:
        """Store one step; fields left out stay NaN. Returns the row's sequence number."""
        self._resolve()
        i = self.num_recorded
        slot = i % self.capacity
        for name, col in self._cols.items():
            col[slot] = values.get(name, math.nan)
        self.num_recorded += 1
        return i

    def update(self, row: int, **values: float) -> None:
        """Add fields to a recorded row (the worker's exchange times of the step), if kept."""
        if self.num_recorded - row > self.capacity:
            return
        slot = row % self.capacity
        for name, value in values.items():
            self._cols[name][slot] = value

    def row(self, i: int) -> np.ndarray:
        """Row i's values in `fields` order (i must still be kept)."""
        if not self.num_recorded - self.capacity <= i < self.num_recorded:
            raise IndexError(f"row {i} is not kept")
        slot = i % self.capacity
        return np.array([col[slot] for col in self._cols.values()])

    def attach_gpu_events(self, row: int, start: object, end: object) -> None:
        self._pending.append((row, start, end, self._last_end))
        self._last_end = end

    def _resolve(self, wait: bool = False) -> None:
        while self._pending:
            row, start, end, before = self._pending[0]
            if not wait and not end.query():
                return
            if wait:
                end.synchronize()
            self._pending.popleft()
            gap = before.elapsed_time(start) / 1e3 if before is not None else math.nan
            self.update(row, gpu_s=start.elapsed_time(end) / 1e3, gpu_gap_s=max(gap, 0.0))

    def columns(self, since: float | None = None, until: float | None = None) -> dict:
        """The kept rows in step order, optionally only steps that started in [since, until)."""
        self._resolve(wait=True)
        n = min(self.num_recorded, self.capacity)
        first = self.num_recorded - n
        order = (np.arange(first, self.num_recorded)) % self.capacity
        cols = {name: col[order] for name, col in self._cols.items()}
        keep = np.ones(n, dtype=bool)
        if since is not None:
            keep &= cols["start"] >= since
        if until is not None:
            keep &= cols["start"] < until
        return {name: col[keep] for name, col in cols.items()}


def summarize_steps(cols: dict) -> dict:
    """Totals, means and percentiles of a trace window (the benchmark report's step section)."""
    n = len(cols["start"])
    if n == 0:
        return {"steps": 0}
    span = float(cols["start"][-1] + cols["wall_s"][-1] - cols["start"][0])
    out: dict = {"steps": n, "span_s": span, "steps_per_s": n / span if span > 0 else math.nan}
    for name, col in cols.items():
        if name == "start":
            continue
        finite = col[np.isfinite(col)]
        if finite.size == 0:
            continue
        unit = 1e3 if name.endswith("_s") else 1.0
        key = name[:-2] + "_ms" if name.endswith("_s") else name
        out[key] = {
            "mean": float(finite.mean() * unit),
            "p50": float(np.percentile(finite, 50) * unit),
            "p95": float(np.percentile(finite, 95) * unit),
            "max": float(finite.max() * unit),
        }
        if name.endswith("_s"):
            out[key]["total_s"] = float(finite.sum())
        elif name == "kernel_compiles":
            out[key]["total"] = float(finite.sum())
    if "gpu_s" in cols and span > 0:
        gpu = cols["gpu_s"][np.isfinite(cols["gpu_s"])]
        out["gpu_busy_fraction"] = float(gpu.sum() / span) if gpu.size else math.nan
    out["gpu_idle_between_steps"] = gpu_idle_between_steps(cols)
    return out


def gpu_idle_between_steps(cols: dict) -> float:
    """The GPU's idle share of the window from the first step's start to the last one's end,
    on the GPU's own clock: Σ gaps / (Σ gaps + Σ step times). NaN without GPU events."""
    gap, gpu = cols.get("gpu_gap_s"), cols.get("gpu_s")
    if gap is None or gpu is None or len(gap) < 2:
        return math.nan
    gaps = gap[1:]  # the first step's gap reaches back before the window
    gaps, busy = gaps[np.isfinite(gaps)], gpu[np.isfinite(gpu)]
    if not busy.size:
        return math.nan
    return float(gaps.sum() / (gaps.sum() + busy.sum()))
