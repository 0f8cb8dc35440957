# /v1/files: upload (multipart, purpose=batch), list, retrieve, content, delete. Tenant-scoped.
from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Form, Query, UploadFile
from fastapi.responses import Response

from api.deps import CurrentPrincipal, SessionDep, SettingsDep
from api.openapi import AUTHED, WITH_BODY, errors
from api.schemas.files import FileDeleted, FileList, FileObject
from metering import files
from metering.batch_input import MalformedFile, parse_batch_file
from metering.batch_models import StoredFile
from metering.text_rules import NO_NUL_PATTERN, column_length, text_problem
from service.errors import APIError, invalid_param

router = APIRouter(tags=["files"])
FILENAME_MAX_CHARS = column_length(StoredFile.filename)


class FileContent(Response):
    media_type = "application/octet-stream"


def not_found(file_id: str) -> APIError:
    return APIError(404, f"No such File object: {file_id}", param="id", code="file_not_found")


@router.post("/v1/files", responses=errors(*WITH_BODY))
def upload_file(
    session: SessionDep,
    settings: SettingsDep,
    principal: CurrentPrincipal,
    file: UploadFile,
    purpose: Annotated[Literal["batch"], Form(description="Only batch input is accepted.")],
) -> FileObject:
    name = file.filename or "upload.jsonl"
    problem = text_problem(name, FILENAME_MAX_CHARS)
    if problem is not None:
        raise invalid_param("file", f"the file name {problem}", code="invalid_filename")
    limit = settings.file_max_bytes
    content = file.file.read(limit + 1)
    if len(content) > limit:
        raise invalid_param("file", f"the file is larger than {limit} bytes", code="file_too_large")
    try:
        parse_batch_file(content, settings.batch_max_lines)
    except MalformedFile as exc:
        raise invalid_param("file", str(exc), code="invalid_batch_file") from None
    return FileObject.of(files.create_file(session, principal.tenant_id, purpose, name, content))


@router.get("/v1/files", responses=errors(*AUTHED))
def list_files(
    session: SessionDep,
    principal: CurrentPrincipal,
    purpose: Annotated[str | None, Query(max_length=64, pattern=NO_NUL_PATTERN)] = None,
    after: Annotated[str | None, Query(description="A file id: list the files after it.")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Annotated[str, Query(pattern="^(asc|desc)$")] = "desc",
) -> FileList:
    found = files.list_files(
        session,
        principal.tenant_id,
        purpose=purpose,
        after=after,
        limit=limit + 1,
        newest_first=order == "desc",
    )
    return FileList.page([FileObject.of(f) for f in found], limit)


@router.get("/v1/files/{file_id}", responses=errors(*AUTHED, 404))
def retrieve_file(file_id: str, session: SessionDep, principal: CurrentPrincipal) -> FileObject:
    f = files.get_file(session, principal.tenant_id, file_id)
    if f is None:
        raise not_found(file_id)
    return FileObject.of(f)


@router.get(
    "/v1/files/{file_id}/content",
    response_class=FileContent,
    responses={200: {"content": {FileContent.media_type: {"schema": {"type": "string"}}}}}
    | errors(*AUTHED, 404),
)
def file_content(file_id: str, session: SessionDep, principal: CurrentPrincipal) -> FileContent:
    f = files.get_file(session, principal.tenant_id, file_id, with_content=True)
    if f is None:
        raise not_found(file_id)
    return FileContent(f.content)


@router.delete("/v1/files/{file_id}", responses=errors(*AUTHED, 404))
def delete_file(file_id: str, session: SessionDep, principal: CurrentPrincipal) -> FileDeleted:
    if not files.delete_file(session, principal.tenant_id, file_id):
        raise not_found(file_id)
    return FileDeleted(id=file_id, deleted=True)
