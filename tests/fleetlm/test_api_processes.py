# `fleetlm serve`'s API processes (fleetlm/api_processes.py): how many, and what each is given —
# the inherited listening sockets and, with more than one, the shared metrics directory.
from __future__ import annotations

import socket

import pytest

from fleetlm import serve_cmd
from fleetlm.api_processes import num_api_processes, open_listeners
from fleetlm.cli import build_parser
from service.settings import Settings
from tests.e2e.conftest import free_port


def test_the_number_follows_the_setting_or_the_cpus(monkeypatch):
    assert num_api_processes(Settings(_env_file=None, api_processes=3)) == 3
    auto = Settings(_env_file=None)
    for cpus, expected in ((1, 1), (2, 1), (7, 1), (8, 2), (16, 4), (96, 4)):
        monkeypatch.setattr("os.sched_getaffinity", lambda _pid, n=cpus: set(range(n)))
        assert num_api_processes(auto) == expected, cpus


def test_each_api_process_inherits_the_sockets(tmp_path):
    port, metrics_port = free_port(), free_port()
    settings = Settings(_env_file=None, port=port, metrics_port=metrics_port, api_processes=2)
    api = open_listeners(settings, tmp_path, num_api_processes(settings))
    try:
        assert [s.getsockname()[1] for s in api.sockets] == [port, metrics_port]
        assert all(s.get_inheritable() for s in api.sockets)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # listening before any API process exists
        args = build_parser("serve").parse_args(["serve"])
        children, _ = serve_cmd._children(args, settings, {"X": "1"}, api)
        apis = [c for c in children if c.name.startswith("api")]
        assert [c.name for c in apis] == ["api-0", "api-1"]
        fds = ",".join(str(s.fileno()) for s in api.sockets)
        for child in apis:
            assert child.argv[-2:] == ["--listen-fds", fds]
            assert child.pass_fds == tuple(s.fileno() for s in api.sockets)
            assert child.env["PROMETHEUS_MULTIPROC_DIR"] == str(tmp_path / "api-metrics")
            assert child.env["X"] == "1"
        assert (tmp_path / "api-metrics").is_dir()
        workers = [c for c in children if not c.name.startswith("api")]
        assert all("PROMETHEUS_MULTIPROC_DIR" not in c.env for c in workers)
    finally:
        api.close()


def test_one_api_process_needs_no_metrics_directory(tmp_path):
    settings = Settings(_env_file=None, port=free_port(), api_processes=1)
    api = open_listeners(settings, tmp_path, 1)
    try:
        assert api.metrics_dir is None and api.env({"X": "1"}) == {"X": "1"}
        assert not (tmp_path / "api-metrics").exists()
    finally:
        api.close()


def test_a_busy_port_is_refused_before_any_process_starts(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        settings = Settings(_env_file=None, port=taken.getsockname()[1], api_processes=2)
        with pytest.raises(OSError):
            open_listeners(settings, tmp_path, 2)
