# Admin endpoints (admin keys only): tenants and their limits.
from __future__ import annotations

import asyncio

from fastapi import APIRouter

from api.deps import AdminPrincipal, State
from metering.tenants import list_limits, list_tenants

router = APIRouter(tags=["admin"])


@router.get("/v1/admin/tenants")
async def tenants(state: State, _: AdminPrincipal) -> dict[str, object]:
    def read() -> list[dict]:
        with state.sessions() as session:
            limits: dict[str, dict] = {}
            for r in list_limits(session):
                limits.setdefault(r.tenant, {})[r.priority] = {
                    "max_concurrency": r.max_concurrency,
                    "tokens_per_minute": r.tokens_per_minute,
                }
            return [t | {"limits": limits.get(t["tenant"], {})} for t in list_tenants(session)]

    return {"object": "list", "data": await asyncio.to_thread(read)}
