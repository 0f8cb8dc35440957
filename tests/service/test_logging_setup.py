# The console at the default level: what an operator acts on, not the libraries' routine lines.
from __future__ import annotations

import logging

import pytest

from service.logging_setup import configure_logging


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name in ("celery", "kombu"):
        logging.getLogger(name).setLevel(logging.NOTSET)


def _emit_routine_and_alarms() -> None:
    # What Celery logs every batch_sweep_s (beat and worker), and what must still show.
    logging.getLogger("celery.beat").info("Scheduler: Sending due task sweep-batches")
    logging.getLogger("celery.worker.strategy").info("Task fleetlm.batches.sweep[1] received")
    logging.getLogger("celery.app.trace").info("Task fleetlm.batches.sweep[1] succeeded")
    logging.getLogger("celery.app.trace").error("Task fleetlm.batches.advance[2] raised")
    logging.getLogger("fleetlm.worker").info("worker w-1 ready")


def test_housekeeping_is_debug_only(capsys, restore_logging):
    configure_logging("celery-beat", "text", "INFO")
    _emit_routine_and_alarms()
    err = capsys.readouterr().err
    assert "sweep" not in err
    assert "advance[2] raised" in err and "worker w-1 ready" in err

    configure_logging("celery-beat", "text", "DEBUG")
    _emit_routine_and_alarms()
    err = capsys.readouterr().err
    assert "Sending due task sweep-batches" in err and "sweep[1] succeeded" in err
