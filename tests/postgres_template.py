# One initdb per test session instead of one per embedded Postgres: a first start's initdb waits
# for every file of the new cluster to reach the disk, about 1 s on a quiet 2-core machine and
# 4-8 s on a busy one (copying the cluster: 0.1-1 s), and the suite starts some twenty
# `fleetlm serve` on fresh data directories. start_server (tests/e2e/conftest.py) and the
# in-process tests' services (tests/conftest.py) copy this cluster into a fresh data directory,
# where pgserver finds it initialized and starts it as after a restart; migrations, tenants and
# keys are still made by the server itself. The first-start path (initdb inside `fleetlm serve`)
# stays covered by the README test and `fleetlm bench serve --launch`, which start from nothing.
from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from pathlib import Path


@functools.cache
def postgres_template() -> Path:
    """An initialized, never started Postgres data directory, as pgserver's initdb makes it
    (without the wait for the disk: a test cluster need not outlive a machine crash)."""
    from service.embedded import ensure_runtime_dir

    ensure_runtime_dir()  # before pgserver's import reads it
    from pgserver._commands import initdb
    from pgserver.utils import ensure_prefix_permissions, ensure_user_exists

    # Not under pytest's basetemp, as tests/conftest.py's services: a concurrent pytest session
    # chmods that to 0700, which locks out the user pgserver runs Postgres as (when root).
    root = Path(tempfile.mkdtemp(prefix="fleetlm-pg-template-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    pgdata = root / "postgres"
    pgdata.mkdir(mode=0o700)
    user = None
    if os.geteuid() == 0:  # pgserver runs Postgres as its own unprivileged user
        user = "pgserver"
        entry = ensure_user_exists(user)
        ensure_prefix_permissions(pgdata)
        os.chown(pgdata, entry.pw_uid, entry.pw_gid)
    # pgserver's own initdb arguments (pgserver/postgres_server.py), plus --no-sync
    args = ["--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", "postgres", "--no-sync"]
    initdb(args, pgdata=pgdata, user=user)
    return pgdata


def copy_postgres_template(data_dir: Path) -> None:
    """Puts an initialized cluster at data_dir/postgres, owned as pgserver would own it."""
    template = postgres_template()
    target = data_dir / "postgres"
    shutil.copytree(template, target, symlinks=True)
    owner = template.stat()
    if os.geteuid() == 0:
        for path in [target, *target.rglob("*")]:
            os.chown(path, owner.st_uid, owner.st_gid, follow_symlinks=False)
