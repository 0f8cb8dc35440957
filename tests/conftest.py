# Shared test setup. Triton runs in interpreter mode on CPU-only machines; the variable must be
# set before anything imports triton. The embedded Redis and PostgreSQL (the schema built by the
# migrations) serve every in-process test that needs them: tests/metering, tests/service,
# tests/api and tests/workers.
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from tests.postgres_template import copy_postgres_template

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # One intra-op thread for what runs in the pytest process (the engine on CPU, HF models):
    # torch's default, a thread per core, spins those threads against the servers and workers
    # the tests start (and anything else on the machine). On a busy 2-core machine the HF-parity
    # runs took 8-40 s with two threads and 0.4-1 s with one. (A worker the tests start sets its
    # own, FLEETLM_TORCH_THREADS.)
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; this machine has none (run on the H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def services():
    from fleetlm.migrate_cmd import upgrade
    from service.embedded import EmbeddedServices

    # Not under pytest's basetemp: any concurrent pytest session chmods /tmp/pytest-of-<user>
    # to 0700, which locks out the unprivileged user pgserver runs Postgres as (when root).
    root = Path(tempfile.mkdtemp(prefix="fleetlm-services-"))
    copy_postgres_template(root / "data")  # one initdb per session: see postgres_template.py
    svc = EmbeddedServices(root / "data")
    svc.start(redis=True, postgres=True)
    try:
        upgrade(svc.database_url)
        yield svc
    finally:
        svc.stop()
        shutil.rmtree(root, ignore_errors=True)
