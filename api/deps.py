# Annotated dependencies for the routes.
from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request
from redis.asyncio import Redis

from api.auth import forbidden
from api.state import AppState
from metering.keys import Principal
from service.settings import Settings


def get_state(request: Request) -> AppState:
    return request.app.state.fleetlm


State = Annotated[AppState, Depends(get_state)]


def get_settings(state: State) -> Settings:
    return state.settings


def get_redis(state: State) -> Redis:
    return state.redis


async def current_principal(
    state: State, authorization: Annotated[str | None, Header()] = None
) -> Principal:
    return await state.keys.verify(authorization)


SettingsDep = Annotated[Settings, Depends(get_settings)]
RedisDep = Annotated[Redis, Depends(get_redis)]
CurrentPrincipal = Annotated[Principal, Depends(current_principal)]


def require_admin(principal: CurrentPrincipal) -> Principal:
    if not principal.is_admin:
        raise forbidden("this endpoint needs an admin key")
    return principal


AdminPrincipal = Annotated[Principal, Depends(require_admin)]
