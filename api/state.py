# What the app holds for its lifetime: built in main's lifespan, reached through api/deps.py.
from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from api.auth import KeyVerifier
from api.client_leases import ClientLeases
from api.load_shedding import LoadShedder
from api.stream_mux import StreamMux
from service.schemas.models import ModelCard
from service.settings import Settings


@dataclass
class AppState:
    settings: Settings
    redis: Redis
    db: Engine
    sessions: sessionmaker[Session]
    keys: KeyVerifier
    shedder: LoadShedder
    tokenizer: object  # engine.tokenizer.Tokenizer | ByteTokenizer
    model_card: ModelCard
    mux: StreamMux | None  # one XREAD for all the output streams this process relays
    leases: ClientLeases  # the relayed requests' leases, which tell workers this process lives
