# OpenAI-shaped errors: {"error": {"message", "type", "param", "code"}} with the matching status.
# Raised by admission (the API and the batch runner alike); the API's handlers are api/errors.py.
from __future__ import annotations

from typing import Any


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


def unavailable(what: str, code: str, retry_after_s: int) -> APIError:
    """503 while a service the request needs does not answer: retry shortly, never a 500."""
    return APIError(
        503,
        f"{what} is unavailable; retry the request shortly.",
        type="server_error",
        code=code,
        headers={"Retry-After": str(retry_after_s)},
    )


def redis_unavailable(retry_after_s: int) -> APIError:
    return unavailable("The request queue", "redis_unavailable", retry_after_s)


def database_unavailable(retry_after_s: int) -> APIError:
    return unavailable("The database", "database_unavailable", retry_after_s)


# Worker-side error codes → HTTP status for non-streaming responses.
EVENT_STATUS = {
    "invalid_request": 400,
    "worker_lost": 503,
    "no_workers": 503,
    "redis_unavailable": 503,
    "shutdown": 503,
    "cancelled": 499,
}


def event_error(event: dict[str, Any]) -> APIError:
    code = event.get("code") or "server_error"
    status = EVENT_STATUS.get(code, 500)
    kind = "invalid_request_error" if status == 400 else "server_error"
    return APIError(status, event.get("message") or "request failed", type=kind, code=code)
