# OpenAI's cursor-paged list object. Routes fetch limit + 1 items; the extra one only says
# whether there is more.
from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import BaseModel


class ListPage(BaseModel):
    object: Literal["list"] = "list"
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False

    @classmethod
    def page(cls, fetched: list[Any], limit: int) -> Self:
        data = fetched[:limit]
        return cls(
            data=data,
            first_id=data[0].id if data else None,
            last_id=data[-1].id if data else None,
            has_more=len(fetched) > limit,
        )
