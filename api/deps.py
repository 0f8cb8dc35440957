# Annotated dependencies for the routes.
from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from redis.asyncio import Redis
from sqlalchemy.orm import Session

from api.auth import forbidden
from api.state import AppState
from metering.db import transaction
from metering.keys import Principal
from service.settings import Settings


def get_state(request: Request) -> AppState:
    return request.app.state.fleetlm


State = Annotated[AppState, Depends(get_state)]


def get_settings(state: State) -> Settings:
    return state.settings


def get_redis(state: State) -> Redis:
    return state.redis


# Declares the bearer scheme in the OpenAPI document; the key itself is checked by KeyVerifier
# (api/auth.py), which answers a missing or wrong key with the OpenAI-shaped 401.
bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer <key>`.")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def authorization(credentials: HTTPAuthorizationCredentials | None) -> str | None:
    """The Authorization header KeyVerifier reads, from what HTTPBearer parsed."""
    return None if credentials is None else f"Bearer {credentials.credentials}"


async def current_principal(state: State, credentials: Credentials) -> Principal:
    return await state.keys.verify(authorization(credentials))


def get_session(state: State) -> Iterator[Session]:
    """The request's unit of work: committed when the handler returns, rolled back when it
    raises (services never commit). A sync dependency, so FastAPI runs it, like the sync
    handlers that take it, in its threadpool, off the event loop."""
    with transaction(state.sessions) as session:
        yield session


SettingsDep = Annotated[Settings, Depends(get_settings)]
# scope="function": the commit happens before the response is sent (and before any
# background task), so a client never sees an id its next request cannot find.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
RedisDep = Annotated[Redis, Depends(get_redis)]
CurrentPrincipal = Annotated[Principal, Depends(current_principal)]


def require_admin(principal: CurrentPrincipal) -> Principal:
    if not principal.is_admin:
        raise forbidden("this endpoint needs an admin key")
    return principal


AdminPrincipal = Annotated[Principal, Depends(require_admin)]
