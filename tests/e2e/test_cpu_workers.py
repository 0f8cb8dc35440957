# `fleetlm serve` says how many torch threads its CPU workers use, and the worker uses that many.
from __future__ import annotations

import pytest

from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


def _whole_log(server) -> str:
    return server.log_path.read_text(errors="replace")  # server.log() is only its tail


def test_serve_says_what_its_cpu_worker_uses(server):
    said = "1 CPU worker(s), 1 torch thread(s) each (FLEETLM_TORCH_THREADS)"
    wait_until(lambda: said in _whole_log(server), 10, "serve's line about its workers")
    assert "torch uses 1 intra-op thread(s)" in _whole_log(server)
