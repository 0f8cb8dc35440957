# The Celery app: the control plane for batch jobs (docs/batches.md). Its broker is the serving
# Redis; tasks are long-lived in effect (a pump re-schedules itself), so each message is acked only
# after it ran (acks_late) and a worker reserves one at a time (prefetch 1). A message of a killed
# worker is redelivered after the visibility timeout; the beat sweep re-arms a silent batch sooner.
# The API sends tasks by name; the tasks themselves are workers/batch/tasks.py, which the Celery
# worker process imports.
from __future__ import annotations

from celery import Celery

from service.settings import Settings

ADVANCE_TASK = "fleetlm.batches.advance"  # (batch_id, pump token): one pump of a batch
SWEEP_TASK = "fleetlm.batches.sweep"  # beat: re-arm silent pumps

app = Celery("fleetlm")


def configure(settings: Settings, redis_url: str) -> Celery:
    app.conf.update(
        broker_url=redis_url,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": settings.celery_visibility_timeout_s},
        # JSON only: a message can never carry code (fleetlm/celery_cmd.py relies on it).
        accept_content=["json"],
        task_serializer="json",
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_default_queue="fleetlm",
        worker_hijack_root_logger=False,
        beat_schedule={"sweep-batches": {"task": SWEEP_TASK, "schedule": settings.batch_sweep_s}},
    )
    return app


def send_advance(batch_id: str, token: str | None) -> None:
    app.send_task(ADVANCE_TASK, args=[batch_id, token])
