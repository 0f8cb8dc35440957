# Logging for every fleetlm process: text for people, or one JSON object per line for log
# pipelines (FLEETLM_LOG_FORMAT=json). Request-scoped fields (request_id, tenant_id, ...) come from
# a log call's `extra` or from the request context the API sets, so one request id can be followed
# API → worker → metering writer. At the default level (INFO) a line is something an operator acts
# on or wants to see once (a process ready, a request's end, an outage); the libraries' routine
# chatter (HOUSEKEEPING) shows only at DEBUG.
from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from typing import Any

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "fleetlm_request_id", default=None
)

# LogRecord's own attributes; anything else on a record came from `extra`.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}

# Loggers whose INFO is routine: Celery's per task "received" / "succeeded" (the beat's
# `sweep-batches` every batch_sweep_s, a batch's pumps), the beat's "Sending due task", the
# broker connection and start-up lines. Their warnings and errors (a failed task) still show.
HOUSEKEEPING = ("celery", "kombu")


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    out = {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}
    if "request_id" not in out:
        rid = request_id_var.get()
        if rid is not None:
            out["request_id"] = rid
    return out


class JsonFormatter(logging.Formatter):
    def __init__(self, process: str) -> None:
        super().__init__()
        self.process_name = process

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "process": self.process_name,
            "pid": record.process,
            "msg": record.getMessage(),
            **_extras(record),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    def __init__(self, process: str) -> None:
        super().__init__(f"%(asctime)s {process} %(name)s %(levelname)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = _extras(record)
        if extras:
            line += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        return line


def configure_logging(process: str, fmt: str = "text", level: str = "INFO") -> None:
    """Replaces the root handlers; uvicorn's and SQLAlchemy's loggers propagate into it."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(process) if fmt == "json" else TextFormatter(process))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    quiet = logging.WARNING if root.getEffectiveLevel() > logging.DEBUG else logging.NOTSET
    for name in HOUSEKEEPING:
        logging.getLogger(name).setLevel(quiet)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate = True
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)  # the API logs requests itself
