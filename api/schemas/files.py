# OpenAI file objects.
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from api.schemas.pages import ListPage
from metering.batch_models import StoredFile


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str = "processed"

    @classmethod
    def of(cls, f: StoredFile) -> FileObject:
        return cls(
            id=f.id,
            bytes=f.bytes,
            created_at=int(f.created_at.timestamp()),
            filename=f.filename,
            purpose=f.purpose,
        )


class FileList(ListPage):
    data: list[FileObject]


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool
