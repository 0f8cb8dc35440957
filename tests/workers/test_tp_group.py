# A worker that is a tensor-parallel group: rank 0 (this GpuWorker) speaks to Redis, its engine
# runs a follower process for rank 1 (gloo on the CPU). Outside the engine the group is one
# worker: one heartbeat, one stats hash, one consumer; stopping it stops the follower. And how
# `fleetlm serve` hands GPUs to groups.
from __future__ import annotations

import threading

import pytest
import redis
import torch

from service import streams as p
from tests.waiting import wait_until
from tests.wire import queued_request
from tests.workers.conftest import SETTINGS, events, submit
from workers.gpu.tp_group import visible_devices, worker_gpu_groups
from workers.gpu.worker import GpuWorker

pytestmark = pytest.mark.timeout(180)


def test_a_tensor_parallel_group_serves_as_one_worker(services):
    # Redis database 1: apart from the package's plain worker, which reads database 0's queues.
    url = services.redis_url.rsplit("/", 1)[0] + "/1"
    rds = redis.Redis.from_url(url, decode_responses=True)
    rds.flushdb()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two ranks on this machine's cores
    settings = SETTINGS.model_copy(update={"tensor_parallel_size": 2})
    worker = GpuWorker(settings, url, "w-tp")
    followers = worker.engine._followers.procs
    thread = threading.Thread(target=worker.run, name="tp-worker", daemon=True)
    thread.start()
    try:
        wait_until(lambda: rds.exists(p.alive_key("w-tp")), 60, "the group's heartbeat")
        queued = queued_request(max_tokens=5)
        submit(rds, queued)
        *deltas, done = events(rds, queued.request_id)
        assert done["type"] == "done" and done["usage"]["completion_tokens"] == 5
        assert {e["worker"] for e in [*deltas, done]} == {"w-tp"}
        assert rds.smembers(p.WORKERS_SET) == {"w-tp"}  # the follower is no worker
        assert rds.hget(p.stats_key("w-tp"), "num_total_blocks") == str(SETTINGS.num_kv_blocks)
    finally:
        worker.stopping.set()
        thread.join(timeout=30)
        worker.engine.shutdown()  # what `fleetlm worker` does when the loop ends
        torch.set_num_threads(threads)
        rds.flushdb()
        rds.close()
    assert not thread.is_alive()
    assert [f.poll() for f in followers] == [0]  # released from its loop, exited cleanly


def test_serve_gives_each_group_its_gpus():
    assert worker_gpu_groups(4, 2, None) == [[0, 1], [2, 3]]
    assert worker_gpu_groups(8, 4, None) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert worker_gpu_groups(3, 2, None) == [[0, 1]]  # a GPU short of a second group
    assert worker_gpu_groups(2, 1, None) == [[0], [1]]
    assert worker_gpu_groups(2, 2, 2) == [[0, 1], [0, 1]]  # explicit --workers share GPUs
    assert worker_gpu_groups(0, 2, None) == [[]]  # no GPU: one CPU worker, ranks on the CPU
    assert worker_gpu_groups(0, 1, 0) == worker_gpu_groups(4, 2, 0) == []  # --workers 0
    with pytest.raises(ValueError, match="needs 4 GPUs"):
        worker_gpu_groups(2, 4, None)
    assert visible_devices([2, 3]) == "2,3"
