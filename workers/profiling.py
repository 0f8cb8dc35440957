# vLLM's /start_profile and /stop_profile for one worker: a torch profiler around the engine steps
# between the two, its trace written as Chrome trace JSON (chrome://tracing, ui.perfetto.dev) to
# <profile dir>/<worker id>-<UTC time>.pt.trace.json. Started and stopped on the step loop's
# thread (workers/control.py), which is the thread whose operators the profiler records.
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("fleetlm.worker")


class StepProfiler:
    def __init__(self, directory: Path, worker_id: str, device: torch.device) -> None:
        self.directory = directory
        self.worker_id = worker_id
        self.activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            self.activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profile: torch.profiler.profile | None = None

    @property
    def running(self) -> bool:
        return self._profile is not None

    def start(self) -> dict[str, Any]:
        """Starts profiling; a second start while one runs leaves it running."""
        if self._profile is not None:
            return {"started": False}
        self._profile = torch.profiler.profile(activities=self.activities, record_shapes=True)
        self._profile.start()
        log.info("profiler started")
        return {"started": True}

    def stop(self) -> dict[str, Any]:
        """Stops profiling and writes the trace; without a running profile, there is none."""
        profile, self._profile = self._profile, None
        if profile is None:
            return {"trace": None}
        profile.stop()
        self.directory.mkdir(parents=True, exist_ok=True)
        now = time.time()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"
        path = (self.directory / f"{self.worker_id}-{stamp}.pt.trace.json").resolve()
        profile.export_chrome_trace(str(path))
        log.info("profiler trace written to %s", path)
        return {"trace": str(path)}
