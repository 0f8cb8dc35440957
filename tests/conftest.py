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


_OWN_BASETEMP = pytest.StashKey[Path]()


@pytest.hookimpl(tryfirst=True)  # before the tmpdir plugin's reads the option
def pytest_configure(config):
    # A fresh basetemp of this session's own, not pytest's /tmp/pytest-of-<user>/pytest-<n>: a
    # session sets that shared parent back to 0700 when it starts, which locks the unprivileged
    # user pgserver runs Postgres as (when root) out of the data directories that a session still
    # running made under it, and one a previous session left behind at 0700 failed later runs
    # with permission errors. Removed when no test failed; kept (and named at the end) when one
    # did, for the servers' logs.
    if config.option.basetemp is None:
        path = Path(tempfile.mkdtemp(prefix=f"fleetlm-pytest-{os.geteuid()}-"))
        config.option.basetemp = str(path)
        config.stash[_OWN_BASETEMP] = path


def pytest_sessionfinish(session, exitstatus):
    path = session.config.stash.get(_OWN_BASETEMP, None)
    if path is not None and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        shutil.rmtree(path, ignore_errors=True)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    path = config.stash.get(_OWN_BASETEMP, None)
    if path is not None and path.exists():
        terminalreporter.write_line(f"test files (servers' logs) kept in {path}")


# make test runs in two processes (pytest-xdist, --dist loadscope: each module's tests on one
# process, so a module's server starts once): the directories whose tests start servers or
# processes go first, so the last modules to be handed out are short ones and neither process
# idles long while the other finishes a slow one.
SLOW_FIRST = ("faults", "e2e", "benchmarks", "docs", "models", "engine")


def _slow_first(item: pytest.Item) -> int:
    parts = Path(item.path).relative_to(Path(__file__).parent).parts
    top = parts[0] if len(parts) > 1 else ""
    return SLOW_FIRST.index(top) if top in SLOW_FIRST else len(SLOW_FIRST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_slow_first)  # stable: each module's own order is kept
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
