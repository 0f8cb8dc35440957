# GET /health (the process answers), GET /ready (Redis, Postgres and at least one live worker)
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import text

from api.deps import State
from api.relay import live_workers

router = APIRouter(tags=["health"])


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


def database_ok(state: State) -> bool:
    """Postgres answers (a sync dependency: FastAPI runs it in its threadpool)."""
    try:
        with state.db.connect() as conn:
            return conn.execute(text("SELECT 1")).scalar() == 1
    except Exception:
        return False


@router.get(
    "/ready",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "Not ready, or draining."}},
)
async def ready(
    state: State, request: Request, database: Annotated[bool, Depends(database_ok)]
) -> JSONResponse:
    if request.app.state.drain.draining:
        return JSONResponse({"status": "draining"}, 503)
    checks: dict[str, bool | int] = {}
    try:
        checks["redis"] = bool(await state.redis.ping())
        checks["workers"] = len(await live_workers(state.redis))
    except Exception:
        checks["redis"], checks["workers"] = False, 0

    checks["database"] = database
    ok = checks["redis"] and checks["database"] and checks["workers"] > 0
    return JSONResponse({"status": "ready" if ok else "not ready", **checks}, 200 if ok else 503)
