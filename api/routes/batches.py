# /v1/batches: create, retrieve, list, cancel. Tenant-scoped. The work runs in Celery
# (workers/batch_tasks.py); the API only writes the batch row and kicks its pump.
from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import CurrentPrincipal, State
from api.schemas.batches import BatchList, BatchObject, CreateBatch
from metering import batches, files
from metering.db import transaction
from service.celery_app import send_advance
from service.errors import APIError, invalid_param

router = APIRouter(tags=["batches"])


def not_found(batch_id: str) -> APIError:
    return APIError(404, f"No such Batch object: {batch_id}", param="id", code="batch_not_found")


@router.post("/v1/batches")
async def create_batch(body: CreateBatch, state: State, principal: CurrentPrincipal) -> BatchObject:
    if body.completion_window not in state.settings.batch_completion_windows:
        allowed = ", ".join(state.settings.batch_completion_windows)
        raise invalid_param("completion_window", f"completion_window must be one of: {allowed}")

    def create():
        with transaction(state.sessions) as session:
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
        send_advance(batch.id, batch.pump_token)  # after the commit: the pump must find the row
        return BatchObject.of(batch)

    return await asyncio.to_thread(create)


@router.get("/v1/batches")
async def list_batches(
    state: State,
    principal: CurrentPrincipal,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> BatchList:
    def load():
        with transaction(state.sessions) as session:
            found = batches.list_batches(session, principal.tenant_id, after=after, limit=limit + 1)
            return [BatchObject.of(b) for b in found]

    return BatchList.page(await asyncio.to_thread(load), limit)


@router.get("/v1/batches/{batch_id}")
async def retrieve_batch(batch_id: str, state: State, principal: CurrentPrincipal) -> BatchObject:
    def load():
        with transaction(state.sessions) as session:
            b = batches.get_batch(session, principal.tenant_id, batch_id)
            return None if b is None else BatchObject.of(b)

    found = await asyncio.to_thread(load)
    if found is None:
        raise not_found(batch_id)
    return found


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, state: State, principal: CurrentPrincipal) -> BatchObject:
    def cancel():
        with transaction(state.sessions) as session:
            b = batches.get_batch(session, principal.tenant_id, batch_id, lock=True)
            if b is None:
                raise not_found(batch_id)
            if not batches.request_cancel(b):
                raise APIError(
                    409, f"Cannot cancel a batch with status {b.status}.", code="batch_not_active"
                )
            return BatchObject.of(b)

    return await asyncio.to_thread(cancel)
