# A real worker's side of the control commands (workers/gpu/control.py), in process: it answers each
# command between two steps on the command's reply list, drops a command whose caller stopped
# waiting, and reports a command it cannot run as failed instead of dying on it.
from __future__ import annotations

import time
import uuid

import pytest

from service import streams as p
from service.control import ControlCommand, ControlReply
from tests.wire import queued_request
from tests.workers.conftest import WORKER_ID, events, submit

pytestmark = pytest.mark.timeout(60)


def _send(rds, command: str, deadline_s: float = 10.0) -> str:
    reply_to = p.control_reply_key(uuid.uuid4().hex)
    message = ControlCommand(command, reply_to, time.time() + deadline_s)  # type: ignore[arg-type]
    rds.rpush(p.control_key(WORKER_ID), message.encode())
    return reply_to


def _reply(rds, reply_to: str) -> ControlReply:
    item = rds.blpop([reply_to], timeout=20)
    assert item is not None, "the worker did not answer"
    return ControlReply.decode(item[1])


def test_reset_prefix_cache_is_answered_with_the_freed_blocks(gpu_worker, rds):
    queued = queued_request(max_tokens=2, prompt=list(range(1, 50)))  # three full blocks
    submit(rds, queued)
    events(rds, queued.request_id)
    reply = _reply(rds, _send(rds, "reset_prefix_cache"))
    assert reply == ControlReply(WORKER_ID, True, {"freed_blocks": reply.result["freed_blocks"]})
    assert reply.result["freed_blocks"] >= 3


def test_a_late_command_is_dropped_and_an_unknown_one_fails(gpu_worker, rds):
    late = _send(rds, "start_profile", deadline_s=-1)  # its caller already gave up
    unknown = _send(rds, "load_lora")
    failed = _reply(rds, unknown)
    assert not failed.ok and "load_lora" in failed.error
    assert rds.llen(late) == 0 and not gpu_worker.control.profiler.recording
    # ... and the worker still serves.
    queued = queued_request(max_tokens=2)
    submit(rds, queued)
    assert events(rds, queued.request_id)[-1]["type"] == "done"
