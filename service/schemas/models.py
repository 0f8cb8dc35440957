# /v1/models shapes.
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "fleetlm"
    max_model_len: int
    # Token ids below this are valid prompts (load tools that send token ids need it).
    vocab_size: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
