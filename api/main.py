# The FastAPI app: assembles state, error handlers and routers; nothing else lives here.
from __future__ import annotations

import gc
import math
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api import body_limits, errors, openapi
from api import metrics as metrics_routes
from api.auth import KeyVerifier
from api.client_leases import ClientLeases
from api.drain import Drain
from api.load_shedding import LoadShedder
from api.loop_watch import LoopWatch
from api.revoked_keys import RevokedKeys
from api.routes import (
    admin,
    batches,
    chat,
    completions,
    engine_control,
    files,
    health,
    internal,
    models,
    usage,
)
from api.state import AppState
from api.stream_mux import StreamMux
from engine.tokenizer import Tokenizer
from metering.db import make_engine, make_sessionmaker
from service.celery_app import configure
from service.prepare import prepare_grammars
from service.redis_clients import async_redis
from service.schemas.models import ModelCard
from service.settings import Settings


def create_app(settings: Settings, redis_url: str, database_url: str) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        configure(settings, redis_url)  # the batch routes send tasks through it
        # A database that does not answer fails a new connection after this long (libpq's
        # minimum is 2 s) rather than hanging a request.
        connect_timeout = max(2, math.ceil(settings.database_timeout_s))
        db = make_engine(database_url, connect_args={"connect_timeout": connect_timeout})
        sessions = make_sessionmaker(db)
        redis = async_redis(
            redis_url,
            settings,
            block_s=settings.relay_poll_s,  # the relay's XREAD BLOCK
            max_connections=settings.redis_max_connections,
        )
        max_model_len = settings.resolved_max_model_len()
        revoked = RevokedKeys(redis)
        revoked.start()
        app.state.fleetlm = AppState(
            settings=settings,
            redis=redis,
            db=db,
            sessions=sessions,
            keys=KeyVerifier(
                sessions,
                settings.api_key_cache_s,
                stale_s=settings.api_key_stale_s,
                timeout_s=settings.database_timeout_s,
                retry_after_s=settings.unavailable_retry_after_s,
                revoked=revoked,
            ),
            shedder=LoadShedder(settings),
            tokenizer=Tokenizer.for_model(settings.model),
            model_card=ModelCard(
                id=settings.model_name,
                created=int(time.time()),
                max_model_len=max_model_len,
                vocab_size=settings.vocab_size(),
            ),
            mux=(
                StreamMux(redis, block_ms=max(1, int(settings.relay_mux_block_s * 1000)))
                if settings.relay_mux
                else None
            ),
            leases=ClientLeases(redis, settings),
        )
        prepare_grammars(app.state.fleetlm.tokenizer)
        # Built once and kept: the app and its schemas, the tokenizer, the grammar tables.
        # Frozen, they are not scanned again by every full collection while streams are relayed
        # (a collection runs in the event loop's thread and holds every stream meanwhile).
        gc.collect()
        gc.freeze()
        watch = LoopWatch(settings.api_stall_s)
        watch.start()
        try:
            yield
        finally:
            await watch.aclose()
            await app.state.fleetlm.leases.aclose()
            await revoked.aclose()
            if app.state.fleetlm.mux is not None:
                await app.state.fleetlm.mux.aclose()
            await redis.aclose()
            db.dispose()

    app = FastAPI(
        title="fleetlm",
        description="OpenAI-compatible API: chat and text completions, files and batches.",
        lifespan=lifespan,
    )
    app.state.drain = Drain(settings.drain_delay_s, settings.drain_timeout_s)
    errors.install(app)
    openapi.install(app, settings)
    body_limits.install(app, settings)
    app.add_middleware(metrics_routes.MetricsListenerGuard, settings=settings)
    app.include_router(metrics_routes.router)
    for module in (chat, completions, models, usage, admin, health, internal, engine_control):
        app.include_router(module.router)
    for module in (files, batches):
        app.include_router(module.router)
    return app
