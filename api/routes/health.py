# GET /health (the process answers), GET /ready (Redis and at least one live worker; Postgres is
# reported but not required: serving rides out a database outage, api/auth.py).
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import text

from api.deps import State
from api.relay import live_workers

router = APIRouter(tags=["health"])

_probe: dict[int, asyncio.Future] = {}  # per database engine: the probe in flight


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str  # ready | not ready | draining
    redis: bool | None = None
    database: bool | None = None
    workers: int | None = None  # live workers


@router.get("/health")
async def health() -> Health:
    return Health(status="ok")


def _select_one(state: State) -> bool:
    with state.db.connect() as conn:
        return conn.execute(text("SELECT 1")).scalar() == 1


async def database_ok(state: State) -> bool:
    """Postgres answers within database_timeout_s. One probe at a time: a probe stuck on an
    unresponsive database is waited on again, not joined by another thread."""
    probe = _probe.get(id(state.db))
    if probe is None:
        probe = _probe[id(state.db)] = asyncio.ensure_future(asyncio.to_thread(_select_one, state))
        probe.add_done_callback(lambda _: _probe.pop(id(state.db), None))
    try:
        return await asyncio.wait_for(asyncio.shield(probe), state.settings.database_timeout_s)
    except Exception:
        return False


@router.get(
    "/ready",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "Not ready, or draining."}},
)
async def ready(state: State, request: Request) -> JSONResponse:
    if request.app.state.drain.draining:
        return JSONResponse({"status": "draining"}, 503)
    checks: dict[str, bool | int] = {}
    try:
        checks["redis"] = bool(await state.redis.ping())
        checks["workers"] = len(await live_workers(state.redis))
    except Exception:
        checks["redis"], checks["workers"] = False, 0
    checks["database"] = await database_ok(state)
    ok = checks["redis"] and checks["workers"] > 0
    return JSONResponse({"status": "ready" if ok else "not ready", **checks}, 200 if ok else 503)
