# The request fields that constrain the output to a grammar: OpenAI's `response_format` and
# vLLM's `structured_outputs` / `guided_*` extras, on both generation endpoints. At most one of
# them may ask for a constraint; the chosen one becomes the queue message's structured_output
# (engine.sampling_params.StructuredOutput's fields), and service/prepare.py compiles it once
# (engine/grammar.py) so a schema the grammar engine cannot take is a 400 naming the field.
from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from service.errors import invalid_param
from service.schemas.fields import NonEmptyStr, checked

# OpenAI's rule for a json_schema's name.
SchemaName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
# An object: the grammar engine takes no boolean schema (true/false) as a whole schema.
JsonSchema = dict[str, Any]
COMPILED = (
    "Compiled by the grammar engine: a schema, regex or grammar it cannot compile is refused, "
    "and at most one of response_format, structured_outputs and the guided_* fields may ask "
    "for a constraint."
)


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: SchemaName
    description: str | None = None
    schema_: JsonSchema | None = Field(None, alias="schema")
    # The grammar is enforced whether or not strict is set (as vLLM does): the output always
    # matches the schema, as far as max_tokens lets it finish.
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @field_validator("json_schema")
    @classmethod
    def _schema_only_with_its_type(cls, v, info):
        if v is not None and info.data.get("type") != "json_schema":
            raise ValueError("json_schema is only allowed with type json_schema")
        return v


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: exactly one of these."""

    model_config = ConfigDict(extra="forbid")

    json_: JsonSchema | str | None = Field(None, alias="json")
    regex: NonEmptyStr | None = None
    choice: Annotated[list[NonEmptyStr], Field(min_length=1)] | None = None
    grammar: NonEmptyStr | None = None
    json_object: bool | None = None


def _schema_text(schema: Any, param: str) -> str:
    if isinstance(schema, str):  # vLLM takes a schema as JSON text too
        try:
            schema = json.loads(schema)
        except ValueError:
            raise invalid_param(param, f"{param}: the schema is not valid JSON") from None
    if not isinstance(schema, dict):
        raise invalid_param(param, f"{param}: a JSON schema is an object")
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


class StructuredFields(BaseModel):
    response_format: ResponseFormat | None = checked(
        f"type json_schema needs json_schema.schema. {COMPILED}"
    )
    structured_outputs: StructuredOutputs | None = checked(f"Exactly one field. {COMPILED}")
    guided_json: JsonSchema | str | None = checked(f"A schema, or its JSON text. {COMPILED}")
    guided_regex: NonEmptyStr | None = checked(COMPILED)
    guided_choice: Annotated[list[NonEmptyStr], Field(min_length=1)] | None = checked(COMPILED)
    guided_grammar: NonEmptyStr | None = checked(COMPILED)
    # Hints that change nothing here: one grammar engine (llguidance) serves every request.
    guided_decoding_backend: str | None = None

    def structured_output(self) -> tuple[str, dict[str, str]] | None:
        """(the field that asked, {"kind", "spec"}) or None. Two fields asking → a 400."""
        asked: list[tuple[str, dict[str, str]]] = []
        rf = self.response_format
        if rf is not None and rf.type == "json_object":
            asked.append(("response_format", {"kind": "json_object", "spec": ""}))
        elif rf is not None and rf.type == "json_schema":
            if rf.json_schema is None or rf.json_schema.schema_ is None:
                raise invalid_param(
                    "response_format", "response_format json_schema needs json_schema.schema"
                )
            spec = _schema_text(rf.json_schema.schema_, "response_format")
            asked.append(("response_format", {"kind": "json_schema", "spec": spec}))
        so = self.structured_outputs
        if so is not None:
            chosen = [
                (kind, value)
                for kind, value in (
                    ("json_schema", so.json_),
                    ("regex", so.regex),
                    ("choice", so.choice),
                    ("grammar", so.grammar),
                    ("json_object", so.json_object or None),
                )
                if value is not None
            ]
            if len(chosen) != 1:
                raise invalid_param(
                    "structured_outputs",
                    "structured_outputs takes exactly one of json, regex, choice, grammar, "
                    "json_object",
                )
            asked.append(("structured_outputs", _spec(*chosen[0], "structured_outputs")))
        for name, kind in (
            ("guided_json", "json_schema"),
            ("guided_regex", "regex"),
            ("guided_choice", "choice"),
            ("guided_grammar", "grammar"),
        ):
            value = getattr(self, name)
            if value is not None:
                asked.append((name, _spec(kind, value, name)))
        if len(asked) > 1:
            first, second = asked[0][0], asked[1][0]
            raise invalid_param(second, f"{second} and {first} both constrain the output")
        return asked[0] if asked else None


def _spec(kind: str, value: Any, param: str) -> dict[str, str]:
    if kind == "json_schema":
        return {"kind": kind, "spec": _schema_text(value, param)}
    if kind == "json_object":
        return {"kind": kind, "spec": ""}
    if kind == "choice":
        return {"kind": kind, "spec": json.dumps(value, ensure_ascii=False)}
    return {"kind": kind, "spec": value}
