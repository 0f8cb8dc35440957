# GET /v1/usage: a tenant's usage and cost from the raw usage rows; a tenant key sees its own
# tenant only, an admin key may name any tenant with ?tenant=.
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from api.auth import forbidden
from api.deps import CurrentPrincipal, SessionDep
from api.openapi import AUTHED, errors
from api.schemas.usage import UsageQuery, UsageResponse
from metering.reports import to_csv, usage_lines
from metering.tenants import TenantError, tenant_by_name
from service.errors import APIError

router = APIRouter(tags=["usage"])


@router.get(
    "/v1/usage",
    response_model=UsageResponse,
    responses={
        200: {
            "description": "JSON; with `format=csv`, the lines as CSV (cells that a spreadsheet "
            "would run as a formula are prefixed with ').",
            "content": {"text/csv": {"schema": {"type": "string"}}},
        }
    }
    | errors(*AUTHED, 403, 404),
)
def get_usage(
    session: SessionDep, principal: CurrentPrincipal, query: Annotated[UsageQuery, Query()]
) -> UsageResponse | Response:
    other = query.tenant is not None and query.tenant != principal.tenant_name
    if other and not principal.is_admin:
        raise forbidden("only an admin key may read another tenant's usage")
    today = datetime.now(UTC).date()
    start = query.start or today.replace(day=1)
    end = query.end or today + timedelta(days=1)
    # An end at or before the start is an empty range (no usage), not an error: every pair of
    # dates the document allows is answered.
    name = query.tenant or principal.tenant_name
    groups = (query.group_by,)

    try:
        tenant = tenant_by_name(session, name)
    except TenantError as exc:
        raise APIError(404, str(exc), param="tenant", code="tenant_not_found") from exc
    lines = []
    if end > start:
        lines = usage_lines(session, start=start, end=end, group_by=groups, tenant_id=tenant.id)
    if query.format == "csv":
        return Response(to_csv(lines, groups), media_type="text/csv")
    return UsageResponse(
        tenant=name,
        start=start,
        end=end,
        group_by=query.group_by,
        data=lines,
        total_requests=sum(x["requests"] for x in lines),
        total_cost_micros=sum(x["cost_micros"] for x in lines),
    )
