# What request preparation and admission read: the API's AppState and the batch runner's
# context both carry these, so one code path admits a request from either.
from __future__ import annotations

from typing import Protocol

from redis.asyncio import Redis

from service.schemas.models import ModelCard
from service.settings import Settings


class AdmissionContext(Protocol):
    settings: Settings
    redis: Redis
    tokenizer: object  # engine.tokenizer.Tokenizer | ByteTokenizer
    model_card: ModelCard
