# The app's exception handlers: every error leaves as the OpenAI shape (service/errors.py).
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.auth import DATABASE_ERRORS
from service.errors import APIError, database_unavailable, error_body, redis_unavailable
from service.redis_clients import UNREACHABLE

log = logging.getLogger("fleetlm.api")


async def _api_error(_: Request, exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    param = loc[0] if loc else None
    message = first.get("msg", "invalid request")
    if loc:
        message = f"{'.'.join(loc)}: {message}"
    return JSONResponse(error_body(message, param=param, code="invalid_value"), status_code=400)


async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    return JSONResponse(
        error_body(str(exc.detail), kind), status_code=exc.status_code, headers=exc.headers
    )


def _retry_after_s(request: Request) -> int:
    state = getattr(request.app.state, "fleetlm", None)
    return state.settings.unavailable_retry_after_s if state is not None else 2


async def _redis_error(request: Request, exc: Exception) -> JSONResponse:
    # Redis away (paused, restarting): any route that needed it says so, retryably.
    log.warning("redis unavailable: %s", type(exc).__name__)
    return await _api_error(request, redis_unavailable(_retry_after_s(request)))


async def _database_error(request: Request, exc: Exception) -> JSONResponse:
    log.warning("database unavailable: %s", type(exc).__name__)
    return await _api_error(request, database_unavailable(_retry_after_s(request)))


async def _unexpected_error(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return JSONResponse(
        error_body(f"internal error: {type(exc).__name__}", "server_error"), status_code=500
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
