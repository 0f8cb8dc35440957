# `fleetlm serve --tensor-parallel-size N`: one worker per group of N GPUs, each worker seeing its
# group's GPUs, and the FP8 / tensor-parallel flags reaching the workers' settings.
from __future__ import annotations

import pytest

from fleetlm import serve_cmd
from fleetlm.cli import build_parser
from service.settings import Settings


def _workers(monkeypatch, num_gpus: int, argv: list[str]):
    monkeypatch.setattr(serve_cmd, "count_gpus", lambda: num_gpus)
    args = build_parser("serve").parse_args(["serve", *argv])
    settings = Settings(_env_file=None, **serve_cmd.engine_flag_values(args))
    children, _ = serve_cmd._children(args, settings, {"FLEETLM_DATA_DIR": "/tmp/x"})
    return settings, [c for c in children if c.name.startswith("worker-")]


def test_one_worker_per_tensor_parallel_group(monkeypatch):
    argv = ["--tensor-parallel-size", "2", "--quantization", "fp8", "--kv-cache-dtype", "fp8"]
    settings, workers = _workers(monkeypatch, 4, argv)
    assert [w.env["CUDA_VISIBLE_DEVICES"] for w in workers] == ["0,1", "2,3"]
    config = settings.engine_config()
    assert (config.tensor_parallel_size, config.quantization, config.kv_cache_dtype) == (
        2, "fp8", "fp8",
    )  # fmt: skip
    _, plain = _workers(monkeypatch, 2, [])
    assert [w.env["CUDA_VISIBLE_DEVICES"] for w in plain] == ["0", "1"]


def test_a_group_larger_than_the_gpus_is_refused(monkeypatch):
    with pytest.raises(SystemExit, match="needs 4 GPUs"):
        _workers(monkeypatch, 2, ["--tensor-parallel-size", "4"])
