# The OpenAPI document, as true as the server: every route lists the error statuses it returns,
# each with the OpenAI error body; streams, CSV and file downloads carry their own media types
# (declared on the routes with `responses=`). FastAPI's default 422 is removed: validation
# failures are 400s here (api/errors.py).
from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field

from service.schemas.fields import CHECKED
from service.settings import Settings


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = Field(description="The request field at fault, when there is one.")
    code: str = Field(description="Machine-readable: invalid_value, invalid_api_key, ...")


class OpenAIError(BaseModel):
    error: ErrorDetail


WHY = {
    400: "Invalid request: `param` names the field, `code` says what is wrong.",
    401: "Missing or wrong API key.",
    403: "The key may not do this (an admin key is needed).",
    404: "No such object (or model).",
    408: "The request body did not arrive in time.",
    409: "The object is not in a state that allows this.",
    413: "The request body is larger than the server accepts.",
    429: "A tenant limit: see `Retry-After` and the `x-ratelimit-*` headers.",
    500: "A worker failed the request (the message says which and why).",
    503: "No capacity now (queue full, no live worker, or draining): see `Retry-After`.",
}

# Every authenticated route can answer these: a bad parameter, a missing key.
AUTHED = (400, 401)
# ... and a route with a request body these too.
WITH_BODY = (*AUTHED, 408, 413)
# A generation: also an unknown model, tenant limits, the worker's failure, no capacity.
GENERATION = (*WITH_BODY, 404, 429, 500, 503)


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries for a route: each status with the OpenAI error body."""
    return {status: {"model": OpenAIError, "description": WHY[status]} for status in statuses}


# Models that only appear inside server-sent events: FastAPI does not see them, so install() adds
# them to the document's components.
_EVENT_MODELS: dict[str, type[BaseModel]] = {}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def sse_and_json(model: type[BaseModel], chunk: type[BaseModel]) -> dict[int | str, Any]:
    """A generation's 200: one JSON object, or with `stream: true` server-sent events whose
    `data` is a `chunk` object, or an error once streaming began, and last `[DONE]`. (OpenAPI
    3.1: the event stream's `schema` describes each event.)"""
    _EVENT_MODELS[chunk.__name__] = chunk
    json_data = {
        "type": "string",
        "contentMediaType": "application/json",
        "contentSchema": {"anyOf": [_ref(chunk.__name__), _ref("OpenAIError")]},
    }
    event = {
        "type": "object",
        "required": ["data"],
        "properties": {"data": {"anyOf": [{"const": "[DONE]"}, json_data]}},
    }
    return {
        200: {
            "model": model,
            "description": f"`{model.__name__}`; with `stream: true`, server-sent events of "
            f"`{chunk.__name__}` objects (an error object if the request fails once streaming "
            "began), then `data: [DONE]`.",
            "content": {"text/event-stream": {"schema": event}},
        }
    }


_ERROR_REF = {"$ref": "#/components/schemas/OpenAIError"}


def _corrected(document: dict[str, Any]) -> dict[str, Any]:
    """FastAPI's default 422 dropped; errors as JSON even where the route's own response is
    not (FastAPI files every `responses=` model under the route's media type)."""
    for path in document.get("paths", {}).values():
        for operation in path.values():
            responses = operation.get("responses", {})
            responses.pop("422", None)
            for response in responses.values():
                schemas = [c.get("schema") for c in response.get("content", {}).values()]
                if _ERROR_REF in schemas:
                    response["content"] = {"application/json": {"schema": _ERROR_REF}}
    schemas = document.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    for name, model in _EVENT_MODELS.items():
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for nested, definition in schema.pop("$defs", {}).items():
            schemas.setdefault(nested, definition)
        schemas.setdefault(name, schema)
    return document


def _configured(document: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Values the settings fix: a generation's `model` is the one model served, a batch's
    completion window one of batch_completion_windows."""
    schemas = document.get("components", {}).get("schemas", {})
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        if name in schemas:
            schemas[name]["properties"]["model"]["enum"] = [settings.model_name]
            schemas[name]["properties"]["n"]["maximum"] = settings.max_n
    for name, schema in schemas.items():  # an upload: a batch input file, never empty
        if name.startswith("Body_upload_file"):
            schema["properties"]["file"] |= {
                "minLength": 1,
                CHECKED: "JSONL batch input lines.",
                "description": "JSONL in the OpenAI Batch input format, at least one request "
                "line (an empty or malformed file is refused with 400 invalid_batch_file).",
            }
    if "CreateBatch" in schemas:
        windows = schemas["CreateBatch"]["properties"]["completion_window"]
        windows["enum"] = list(settings.batch_completion_windows)
    return document


def install(app: FastAPI, settings: Settings) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            app.openapi_schema = _configured(_corrected(document), settings)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
