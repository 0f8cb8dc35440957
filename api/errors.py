# OpenAI-shaped errors: {"error": {"message", "type", "param", "code"}} with the matching status.
from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("fleetlm.api")


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(
    message: str,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def invalid_param(param: str, message: str, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


# Worker-side error codes → HTTP status for non-streaming responses.
EVENT_STATUS = {"invalid_request": 400, "worker_lost": 503, "no_workers": 503, "cancelled": 499}


def event_error(event: dict[str, Any]) -> APIError:
    code = event.get("code") or "server_error"
    status = EVENT_STATUS.get(code, 500)
    kind = "invalid_request_error" if status == 400 else "server_error"
    return APIError(status, event.get("message") or "request failed", type=kind, code=code)


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


async def _unexpected_error(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return JSONResponse(
        error_body(f"internal error: {type(exc).__name__}", "server_error"), status_code=500
    )


def install(app: FastAPI) -> None:
    app.add_exception_handler(Exception, _unexpected_error)
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
