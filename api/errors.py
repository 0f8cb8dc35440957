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

from service.errors import APIError, default_code, error_body, validation_error

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


async def _http_error(_: Request, exc: StarletteHTTPException) -> ErrorResponse:
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    body = error_body(str(exc.detail), kind, code=default_code(exc.status_code))
    return ErrorResponse(body, status_code=exc.status_code, headers=exc.headers)


async def _unexpected_error(_: Request, exc: Exception) -> ErrorResponse:
    log.exception("unhandled error", exc_info=exc)
    return ErrorResponse(
        error_body(f"internal error: {type(exc).__name__}", "server_error", code="server_error"),
        status_code=500,
    )


def install(app: FastAPI) -> None:
    app.add_exception_handler(Exception, _unexpected_error)
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
