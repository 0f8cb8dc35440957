# Bounded request bodies, before any parsing: a Content-Length over the route's limit is refused
# (413) before a byte is read; a body that grows past it while streaming is cut off at
# the limit (413); a body not complete within body_timeout_s of its headers (stalled, or dripped
# a byte at a time) is answered 408, and the connection is closed (the request was never read to
# its end). Uploads to /v1/files have their own limits: file_max_bytes plus room for the multipart
# framing, and upload_timeout_s.
from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import ErrorResponse, api_error_response
from service.errors import APIError
from service.settings import Settings

MULTIPART_SLACK = 64 * 1024  # boundaries, part headers and the form's other fields


class BodyRefused(HTTPException):
    # An HTTPException, so FastAPI's body parsing re-raises it instead of turning it into its
    # generic "error parsing the body" 400; the app's handler answers with `error`.
    def __init__(self, error: APIError) -> None:
        super().__init__(error.status, error.message, error.headers)
        self.error = error


async def _refused(_: Request, exc: BodyRefused) -> ErrorResponse:
    return api_error_response(exc.error)


def install(app: FastAPI, settings: Settings) -> None:
    app.add_middleware(BodyLimitMiddleware, settings=settings)
    app.add_exception_handler(BodyRefused, _refused)


def too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"The request body is larger than this server accepts ({limit} bytes).",
        code="request_too_large",
        headers={"Connection": "close"},  # the rest of the body is never read
    )


def stalled(timeout_s: float) -> APIError:
    return APIError(
        408,
        f"The request body did not arrive within {timeout_s:g} s.",
        code="request_timeout",
        headers={"Connection": "close"},
    )


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.request_limit = settings.resolved_max_request_bytes()
        self.upload_limit = settings.file_max_bytes + MULTIPART_SLACK
        self.timeout_s = settings.body_timeout_s
        self.upload_timeout_s = settings.upload_timeout_s

    def limits_for(self, scope: Scope) -> tuple[int, float]:
        """(bytes, seconds) for this request's body."""
        if scope["method"] == "POST" and scope["path"].rstrip("/") == "/v1/files":
            return self.upload_limit, self.upload_timeout_s
        return self.request_limit, self.timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, timeout_s = self.limits_for(scope)
        deadline = asyncio.get_running_loop().time() + timeout_s
        declared = _content_length(scope)
        received = 0
        body_done = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, body_done
            if body_done:  # later receives wait for a disconnect: no deadline, nothing to count
                return await receive()
            # Checked when the route first asks for its body, before a byte is read: routes that
            # take no body (GET, DELETE) ignore whatever a client sends.
            if declared is not None and declared > limit:
                raise BodyRefused(too_large(limit))
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise BodyRefused(stalled(timeout_s)) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyRefused(too_large(limit))
                body_done = not message.get("more_body", False)
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except BodyRefused as refused:  # the app's handler normally answers it first
            if started:  # too late for a status: the response is under way
                raise
            await api_error_response(refused.error)(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
