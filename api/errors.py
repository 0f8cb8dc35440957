# The app's exception handlers: every error leaves as the OpenAI shape (service/errors.py), with a
# `code` and, for a bad field, the field's name as `param`.
from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from api.auth import DATABASE_ERRORS
from service.errors import (
    APIError,
    database_unavailable,
    default_code,
    error_body,
    redis_unavailable,
    validation_error,
)
from service.redis_clients import UNREACHABLE

log = logging.getLogger("fleetlm.api")


class ErrorResponse(JSONResponse):
    """ASCII JSON: an error that quotes its input can never fail to encode."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode("ascii")


def api_error_response(exc: APIError) -> ErrorResponse:
    return ErrorResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _api_error(_: Request, exc: APIError) -> ErrorResponse:
    return api_error_response(exc)


async def _validation_error(_: Request, exc: RequestValidationError) -> ErrorResponse:
    return api_error_response(validation_error(exc.errors()))


async def _http_error(request: Request, exc: StarletteHTTPException) -> ErrorResponse:
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    body = error_body(str(exc.detail), kind, code=default_code(exc.status_code))
    headers = exc.headers
    if exc.status_code == 405:
        headers = (headers or {}) | {"Allow": ", ".join(allowed_methods(request))}
    return ErrorResponse(body, status_code=exc.status_code, headers=headers)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at the request's path: Starlette's 405 names only those of
    the first route that matched the path (GET /v1/files and POST /v1/files are two routes)."""
    methods: set[str] = set()
    scope = {**request.scope, "method": "\x00"}  # matches no route's methods: path only
    for route in _flat(request.app.router.routes):
        match, _ = route.matches(scope)
        if match != Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return sorted(methods)


def _flat(routes):
    # FastAPI keeps an included router as one entry that expands to its routes.
    for route in routes:
        if hasattr(route, "effective_route_contexts"):
            yield from route.effective_route_contexts()
        else:
            yield route


def _retry_after_s(request: Request) -> int:
    state = getattr(request.app.state, "fleetlm", None)
    return state.settings.unavailable_retry_after_s if state is not None else 2


async def _redis_error(request: Request, exc: Exception) -> ErrorResponse:
    # Redis away (paused, restarting): any route that needed it says so, retryably.
    log.warning("redis unavailable: %s", type(exc).__name__)
    return api_error_response(redis_unavailable(_retry_after_s(request)))


async def _database_error(request: Request, exc: Exception) -> ErrorResponse:
    log.warning("database unavailable: %s", type(exc).__name__)
    return api_error_response(database_unavailable(_retry_after_s(request)))


async def _unexpected_error(_: Request, exc: Exception) -> ErrorResponse:
    log.exception("unhandled error", exc_info=exc)
    return ErrorResponse(
        error_body(f"internal error: {type(exc).__name__}", "server_error", code="server_error"),
        status_code=500,
    )


def install(app: FastAPI) -> None:
    app.add_exception_handler(Exception, _unexpected_error)
    app.add_exception_handler(APIError, _api_error)
    for error in UNREACHABLE:
        app.add_exception_handler(error, _redis_error)
    for error in DATABASE_ERRORS:
        app.add_exception_handler(error, _database_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
