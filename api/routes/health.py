# GET /health (the process answers), GET /ready (Redis, Postgres and at least one live worker)
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text

from api.deps import State
from api.relay import live_workers

router = APIRouter(tags=["health"])


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready")
async def ready(state: State, request: Request) -> JSONResponse:
    if request.app.state.drain.draining:
        return JSONResponse({"status": "draining"}, 503)
    checks: dict[str, bool | int] = {}
    try:
        checks["redis"] = bool(await state.redis.ping())
        checks["workers"] = len(await live_workers(state.redis))
    except Exception:
        checks["redis"], checks["workers"] = False, 0

    def ping_db() -> bool:
        with state.db.connect() as conn:
            return conn.execute(text("SELECT 1")).scalar() == 1

    try:
        checks["database"] = await asyncio.to_thread(ping_db)
    except Exception:
        checks["database"] = False
    ok = checks["redis"] and checks["database"] and checks["workers"] > 0
    return JSONResponse({"status": "ready" if ok else "not ready", **checks}, 200 if ok else 503)
