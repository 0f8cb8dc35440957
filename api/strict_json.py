# JSON request bodies, decoded once and checked before FastAPI validates them: a body that is not
# JSON, nests too deeply, or carries an unpaired surrogate (a \ud800 escape: it would fail every
# UTF-8 encoder downstream, the tokenizer and Postgres included) is a 400 naming the field, never
# a 500 and never a character offset. Routers use StrictJSONRoute as their route class.
from __future__ import annotations

import email.message
import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from metering.text_rules import unpaired_surrogate_path
from service.errors import APIError

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def is_json(content_type: str | None) -> bool:
    """FastAPI's rule for decoding a body as JSON (fastapi/routing.py)."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def decode_json_body(body: bytes) -> Any:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as exc:
        # ValueError: not JSON, not UTF-8, or an integer over Python's digit limit;
        # RecursionError: nested deeper than the decoder's stack.
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc) or "too deep"
        raise APIError(
            400, f"The request body is not valid JSON: {reason}.", code="invalid_json"
        ) from None
    # Only a \uD800-\uDFFF escape makes a surrogate: most bodies have none, and are not walked.
    path = unpaired_surrogate_path(value) if _SURROGATE_ESCAPE.search(body) else None
    if path is not None:
        raise APIError(
            400,
            f"{path or 'body'}: strings must not contain unpaired UTF-16 surrogates",
            param=path.split(".")[0] or None,
            code="invalid_value",
        )
    return value


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_strict_json"):
            self._strict_json = decode_json_body(await self.body())
        return self._strict_json


class StrictJSONRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            request = StrictJSONRequest(request.scope, request.receive)
            # Decoded here, outside FastAPI's body parsing (which turns any exception into a
            # generic 400), so the APIError reaches the app's handler; FastAPI then reads the
            # same decoded value from this request.
            if is_json(request.headers.get("content-type")) and await request.body():
                await request.json()
            return await handler(request)

        return strict_handler
