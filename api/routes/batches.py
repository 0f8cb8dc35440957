# /v1/batches: create, retrieve, list, cancel. Tenant-scoped. The work runs in Celery
# (workers/batch/tasks.py); the API only writes the batch row and kicks its pump.
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Query

from api.deps import CurrentPrincipal, SessionDep, SettingsDep
from api.openapi import AUTHED, WITH_BODY, errors
from api.schemas.batches import BatchList, BatchObject, CreateBatch
from api.strict_json import StrictJSONRoute
from metering import batches, files
from service.celery_app import send_advance
from service.errors import APIError, invalid_param

router = APIRouter(tags=["batches"], route_class=StrictJSONRoute)


def not_found(batch_id: str) -> APIError:
    return APIError(404, f"No such Batch object: {batch_id}", param="id", code="batch_not_found")


@router.post("/v1/batches", responses=errors(*WITH_BODY))
def create_batch(
    body: CreateBatch,
    session: SessionDep,
    settings: SettingsDep,
    principal: CurrentPrincipal,
    after_commit: BackgroundTasks,
) -> BatchObject:
    if body.completion_window not in settings.batch_completion_windows:
        allowed = ", ".join(settings.batch_completion_windows)
        raise invalid_param("completion_window", f"completion_window must be one of: {allowed}")
    f = files.get_file(session, principal.tenant_id, body.input_file_id)
    if f is None or f.purpose != "batch":
        raise invalid_param(
            "input_file_id", f"No batch input file {body.input_file_id}", "file_not_found"
        )
    batch = batches.create_batch(
        session,
        tenant_id=principal.tenant_id,
        key_id=principal.key_id,
        endpoint=body.endpoint,
        input_file_id=body.input_file_id,
        completion_window=body.completion_window,
        metadata=body.metadata,
    )
    # Background tasks run after the session's commit: the pump must find the row. A kick lost
    # here is re-armed by the beat sweep.
    after_commit.add_task(send_advance, batch.id, batch.pump_token)
    return BatchObject.of(batch)


@router.get("/v1/batches", responses=errors(*AUTHED))
def list_batches(
    session: SessionDep,
    principal: CurrentPrincipal,
    after: Annotated[
        str | None, Query(description="A batch id: list the batches after it.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> BatchList:
    found = batches.list_batches(session, principal.tenant_id, after=after, limit=limit + 1)
    return BatchList.page([BatchObject.of(b) for b in found], limit)


@router.get("/v1/batches/{batch_id}", responses=errors(*AUTHED, 404))
def retrieve_batch(batch_id: str, session: SessionDep, principal: CurrentPrincipal) -> BatchObject:
    b = batches.get_batch(session, principal.tenant_id, batch_id)
    if b is None:
        raise not_found(batch_id)
    return BatchObject.of(b)


@router.post("/v1/batches/{batch_id}/cancel", responses=errors(*AUTHED, 404, 409))
def cancel_batch(batch_id: str, session: SessionDep, principal: CurrentPrincipal) -> BatchObject:
    b = batches.get_batch(session, principal.tenant_id, batch_id, lock=True)
    if b is None:
        raise not_found(batch_id)
    if not batches.request_cancel(b):
        raise APIError(
            409, f"Cannot cancel a batch with status {b.status}.", code="batch_not_active"
        )
    return BatchObject.of(b)
