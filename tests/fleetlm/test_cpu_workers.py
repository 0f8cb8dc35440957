# What `fleetlm serve` gives its CPU workers: torch threads that leave a core to what runs beside
# them (workers/gpu/torch_threads.py), passed to each worker and said at start. No process is
# started.
from __future__ import annotations

import argparse
import os

from fleetlm.serve_cmd import _children
from service.settings import Settings
from workers.gpu.torch_threads import cpu_worker_threads, usable_cores


def test_cpu_workers_split_the_cores_but_one():
    assert cpu_worker_threads(1, cores=2) == 1  # the 2-core box: one thread, not torch's two
    assert cpu_worker_threads(1, cores=16) == 15
    assert cpu_worker_threads(2, cores=16) == 7
    assert cpu_worker_threads(4, cores=2) == 1  # never fewer than one
    assert cpu_worker_threads(1, cores=1) == 1
    assert 1 <= usable_cores() <= (os.cpu_count() or 1)


def _workers(children) -> list:
    return [c for c in children if c.name.startswith("worker-")]


def test_serve_passes_the_choice_to_each_cpu_worker_and_says_it():
    settings = Settings(_env_file=None, device="cpu")
    children, said = _children(argparse.Namespace(workers=2), settings, {})
    threads = cpu_worker_threads(2)
    assert [c.env["FLEETLM_TORCH_THREADS"] for c in _workers(children)] == [str(threads)] * 2
    assert said.startswith(f"2 CPU worker(s), {threads} torch thread(s) each ")
    assert f"{usable_cores()} core(s)" in said


def test_an_explicit_thread_count_wins():
    settings = Settings(_env_file=None, device="cpu", torch_threads=3)
    children, said = _children(argparse.Namespace(workers=1), settings, {})
    assert [c.env["FLEETLM_TORCH_THREADS"] for c in _workers(children)] == ["3"]
    assert said == "1 CPU worker(s), 3 torch thread(s) each (FLEETLM_TORCH_THREADS)"
