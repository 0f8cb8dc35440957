# Admin endpoints (admin keys only): tenants and their limits.
from __future__ import annotations

from fastapi import APIRouter

from api.deps import AdminPrincipal, SessionDep
from api.openapi import AUTHED, errors
from metering.tenants import list_limits, list_tenants

router = APIRouter(tags=["admin"])


@router.get("/v1/admin/tenants", responses=errors(*AUTHED, 403))
def tenants(session: SessionDep, _: AdminPrincipal) -> dict[str, object]:
    limits: dict[str, dict] = {}
    for r in list_limits(session):
        limits.setdefault(r.tenant, {})[r.priority] = {
            "max_concurrency": r.max_concurrency,
            "tokens_per_minute": r.tokens_per_minute,
        }
    data = [t | {"limits": limits.get(t["tenant"], {})} for t in list_tenants(session)]
    return {"object": "list", "data": data}
