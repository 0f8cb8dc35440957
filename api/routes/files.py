# /v1/files: upload (multipart, purpose=batch), list, retrieve, content, delete. Tenant-scoped.
from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Form, Query, UploadFile
from fastapi.responses import Response

from api.deps import CurrentPrincipal, State
from api.schemas.files import FileDeleted, FileList, FileObject
from metering import files
from metering.batch_input import MalformedFile, parse_batch_file
from metering.db import transaction
from service.errors import APIError, invalid_param

router = APIRouter(tags=["files"])


def not_found(file_id: str) -> APIError:
    return APIError(404, f"No such File object: {file_id}", param="id", code="file_not_found")


@router.post("/v1/files")
async def upload_file(
    state: State,
    principal: CurrentPrincipal,
    file: UploadFile,
    purpose: Annotated[str, Form()],
) -> FileObject:
    if purpose != "batch":
        raise invalid_param("purpose", "only purpose=batch is supported")
    limit = state.settings.file_max_bytes
    content = await file.read(limit + 1)
    if len(content) > limit:
        raise invalid_param("file", f"the file is larger than {limit} bytes", code="file_too_large")
    try:
        parse_batch_file(content, state.settings.batch_max_lines)
    except MalformedFile as exc:
        raise invalid_param("file", str(exc), code="invalid_batch_file") from None

    def store():
        with transaction(state.sessions) as session:
            name = file.filename or "upload.jsonl"
            f = files.create_file(session, principal.tenant_id, purpose, name, content)
            return FileObject.of(f)

    return await asyncio.to_thread(store)


@router.get("/v1/files")
async def list_files(
    state: State,
    principal: CurrentPrincipal,
    purpose: str | None = None,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Annotated[str, Query(pattern="^(asc|desc)$")] = "desc",
) -> FileList:
    def load():
        with transaction(state.sessions) as session:
            found = files.list_files(
                session,
                principal.tenant_id,
                purpose=purpose,
                after=after,
                limit=limit + 1,
                newest_first=order == "desc",
            )
            return [FileObject.of(f) for f in found]

    return FileList.page(await asyncio.to_thread(load), limit)


@router.get("/v1/files/{file_id}")
async def retrieve_file(file_id: str, state: State, principal: CurrentPrincipal) -> FileObject:
    def load():
        with transaction(state.sessions) as session:
            f = files.get_file(session, principal.tenant_id, file_id)
            return None if f is None else FileObject.of(f)

    found = await asyncio.to_thread(load)
    if found is None:
        raise not_found(file_id)
    return found


@router.get("/v1/files/{file_id}/content")
async def file_content(file_id: str, state: State, principal: CurrentPrincipal) -> Response:
    def load():
        with transaction(state.sessions) as session:
            f = files.get_file(session, principal.tenant_id, file_id, with_content=True)
            return None if f is None else f.content

    content = await asyncio.to_thread(load)
    if content is None:
        raise not_found(file_id)
    return Response(content, media_type="application/octet-stream")


@router.delete("/v1/files/{file_id}")
async def delete_file(file_id: str, state: State, principal: CurrentPrincipal) -> FileDeleted:
    def delete():
        with transaction(state.sessions) as session:
            return files.delete_file(session, principal.tenant_id, file_id)

    if not await asyncio.to_thread(delete):
        raise not_found(file_id)
    return FileDeleted(id=file_id, deleted=True)
