# OpenAI-shaped errors: {"error": {"message", "type", "param", "code"}} with the matching status.
# Raised by admission (the API and the batch runner alike); the API's handlers are api/errors.py.
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# The code an error carries when its raiser names none: every error has one, so clients can branch
# on `code` without parsing messages.
DEFAULT_CODES = {
    400: "invalid_request",
    401: "invalid_api_key",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    413: "request_too_large",
    429: "rate_limit_exceeded",
    499: "cancelled",
    500: "server_error",
    503: "service_unavailable",
}


def default_code(status: int) -> str:
    return DEFAULT_CODES.get(status, "server_error" if status >= 500 else "invalid_request")


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
        self.param, self.code, self.headers = param, code or default_code(status), headers

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(
    message: str,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# pydantic error types → OpenAI codes; anything else is an invalid_value.
_TYPE_CODES = {
    "missing": "missing_required_parameter",
    "extra_forbidden": "unknown_parameter",
    **dict.fromkeys(
        ("int_type", "float_type", "bool_type", "string_type", "list_type", "dict_type",
         "model_type", "model_attributes_type", "date_type", "date_parsing", "int_parsing",
         "date_from_datetime_parsing"),
        "invalid_type",
    ),
}  # fmt: skip
_SOURCES = {"body", "query", "path", "header", "cookie", "form"}  # FastAPI's first `loc` item
_TYPE_NAMES = {"str", "int", "float", "bool", "dict", "list", "none"}


def _is_union_tag(item: str) -> bool:
    """pydantic names the branch of a union in `loc` ("str", "list[str]", "constrained-str")."""
    return item in _TYPE_NAMES or "[" in item or "-" in item


def validation_error(errors: Sequence[Mapping[str, Any]]) -> APIError:
    """A 400 for pydantic's errors: `param` the top-level field, the message its path. Of a
    union's errors, the first that is not about the type says what is wrong with the value."""
    if not errors:
        return APIError(400, "invalid request")
    first = next((e for e in errors if not str(e.get("type")).endswith("_type")), errors[0])
    kind = str(first.get("type", ""))
    if kind == "json_invalid":  # its loc is a character offset, not a field
        return APIError(400, "The request body is not valid JSON.", code="invalid_json")
    loc = [str(x) for x in first.get("loc", ())]
    if loc and loc[0] in _SOURCES:
        loc = loc[1:]
    loc = [x for x in loc if not _is_union_tag(x)]
    pattern = str((first.get("ctx") or {}).get("pattern", ""))
    if kind == "string_pattern_mismatch" and "\\x00" in pattern:
        message = "must not contain NUL (\\u0000) characters"
    else:
        message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if loc:
        message = f"{'.'.join(loc)}: {message}"
    code = _TYPE_CODES.get(kind, "invalid_value")
    return APIError(400, message, param=loc[0] if loc else None, code=code)


def invalid_param(param: str, message: str, code: str = "invalid_value") -> APIError:
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
