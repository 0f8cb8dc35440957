# One `fleetlm serve --workers 2` (tiny model on CPU) for the ops tests: metrics across two workers,
# then a drain of one of them. The API serves /metrics without a key on its metrics port, worker 0
# on its own port.
from __future__ import annotations

import pytest

from tests.e2e.conftest import free_port, free_ports, start_server


@pytest.fixture(scope="package")
def fleet(tmp_path_factory):
    metrics_port = free_port()
    worker_port = free_ports(2, avoid=(metrics_port,))  # workers 0 and 1 listen on these two
    srv = start_server(
        tmp_path_factory.mktemp("ops") / "data",
        workers=2,
        env={
            "FLEETLM_WORKER_METRICS_PORT": str(worker_port),
            "FLEETLM_METRICS_PORT": str(metrics_port),
            "FLEETLM_METRICS_SNAPSHOT_S": "0.5",
            "FLEETLM_MAX_NUM_SEQS": "2",  # so a busy worker holds unstarted requests to hand back
            "FLEETLM_WORKER_MAX_HELD": "8",
            "FLEETLM_DRAIN_TIMEOUT_S": "60",
            "FLEETLM_LOG_FORMAT": "json",
        },
    )
    srv.worker_metrics_port = worker_port
    srv.metrics_port = metrics_port
    yield srv
    rc = srv.stop()
    assert rc == 0, f"fleetlm serve exited {rc} on SIGTERM:\n{srv.log()}"
