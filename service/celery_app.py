# The Celery app: the control plane for batch jobs (docs/batches.md). Its broker is the serving
# Redis; tasks are long-lived in effect (a pump re-schedules itself), so each message is acked only
# after it ran (acks_late) and a worker reserves one at a time (prefetch 1). A message of a killed
# worker is redelivered after the visibility timeout; the beat sweep re-arms a silent batch sooner.
from __future__ import annotations

import os

from celery import Celery

from service.settings import get_settings

app = Celery("fleetlm", include=["workers.batch_tasks"])


def configure(redis_url: str | None) -> Celery:
    settings = get_settings()
    app.conf.update(
        broker_url=redis_url,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": settings.celery_visibility_timeout_s},
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_default_queue="fleetlm",
        worker_hijack_root_logger=False,
        beat_schedule={
            "sweep-batches": {"task": "fleetlm.batches.sweep", "schedule": settings.batch_sweep_s}
        },
    )
    return app


configure(os.environ.get("REDIS_URL"))
