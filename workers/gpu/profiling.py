# vLLM's /start_profile and /stop_profile for one worker: a torch profiler over the engine steps
# that follow a start, its trace written as Chrome trace JSON (chrome://tracing, ui.perfetto.dev)
# to <profile dir>/<worker id>-<UTC time>.pt.trace.json. It records at most `max_steps` steps:
# the trace is built on the step loop's thread, which then serves nobody, and its size grows with
# every step (unbounded, 12 s of CPU steps made a 729 MB trace and stalled the loop for 30 s).
# Started, stepped and stopped on the step loop's thread (workers/gpu/control.py), the thread whose
# operators the profiler records.
from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("fleetlm.worker")


class StepProfiler:
    def __init__(
        self, directory: Path, worker_id: str, device: torch.device, max_steps: int
    ) -> None:
        self.directory = directory
        self.worker_id = worker_id
        self.max_steps = max_steps
        self.activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            self.activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profile: torch.profiler.profile | None = None
        self._trace: str | None = None  # written: the window is over, or the profile stopped

    @property
    def recording(self) -> bool:
        return self._profile is not None and self._trace is None

    def start(self) -> dict[str, Any]:
        """Starts profiling; a start while one records leaves that one recording."""
        if self.recording:
            return {"started": False}
        self._trace = None
        with warnings.catch_warnings():  # "won't be using warmup": every step is recorded
            warnings.simplefilter("ignore")
            schedule = torch.profiler.schedule(wait=0, warmup=0, active=self.max_steps, repeat=1)
        self._profile = torch.profiler.profile(
            activities=self.activities, schedule=schedule, on_trace_ready=self._write
        )
        self._profile.start()
        log.info("profiler started (at most %d steps)", self.max_steps)
        return {"started": True}

    def step(self) -> None:
        """Before each engine step; the window's last one writes the trace."""
        if self.recording:
            self._profile.step()

    def stop(self) -> dict[str, Any]:
        """Stops profiling; the trace, written now unless the window wrote it (None when no
        profile was started)."""
        profile, self._profile = self._profile, None
        if profile is None:
            return {"trace": None}
        profile.stop()
        return {"trace": self._trace}

    def _write(self, profile: torch.profiler.profile) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        now = time.time()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"
        path = (self.directory / f"{self.worker_id}-{stamp}.pt.trace.json").resolve()
        profile.export_chrome_trace(str(path))
        self._trace = str(path)
        log.info("profiler trace written to %s", path)
