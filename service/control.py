# Control commands from the API to every live worker (vLLM's /reset_prefix_cache, /start_profile,
# /stop_profile). The API RPUSHes one command per worker on fleetlm:worker:{id}:control and waits,
# bounded, on the command's reply list; a worker takes the command between two engine steps and
# LPUSHes its reply there. A command carries its deadline: a worker that takes it later drops it,
# so a profiler is never started for a caller that has already given up. Defined, encoded and
# decoded here.
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Command = Literal["reset_prefix_cache", "start_profile", "stop_profile"]


@dataclass(slots=True)
class ControlCommand:
    command: Command
    reply_to: str  # the list the reply goes to (service.streams.control_reply_key)
    deadline: float  # wall clock (time.time()); taken later, the command is dropped

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def decode(cls, raw: str | bytes) -> ControlCommand:
        return cls(**json.loads(raw))


@dataclass(slots=True)
class ControlReply:
    worker: str
    ok: bool
    # reset_prefix_cache: {"freed_blocks": n}; start_profile: {"started": bool} (False: one was
    # already running); stop_profile: {"trace": path or None when none was running}
    result: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # when not ok: what went wrong

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def decode(cls, raw: str | bytes) -> ControlReply:
        return cls(**json.loads(raw))
