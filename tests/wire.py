# Queue messages as admission writes them (service/queued_request.py), for tests that play the
# API's part.
from __future__ import annotations

import time
import uuid

from engine.sampling_params import SamplingParams
from service.queued_request import QueuedRequest


def queued_request(
    prompt: list[int] | None = None, priority: str = "interactive", **sampling
) -> QueuedRequest:
    """A completions request of a fresh tenant; greedy, ignoring EOS unless told otherwise."""
    return QueuedRequest(
        request_id=f"cmpl-{uuid.uuid4().hex}",
        tenant_id=str(uuid.uuid4()),
        key_id=str(uuid.uuid4()),
        model="tiny",
        endpoint="completions",
        priority=priority,
        prompt_token_ids=prompt or list(range(1, 11)),
        sampling=SamplingParams(**{"temperature": 0.0, "ignore_eos": True, **sampling}),
        enqueued_at=time.time(),
    )
