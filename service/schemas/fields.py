# Constrained field types for requests (strings, maps, integers), declared in the schemas so
# the OpenAPI document states exactly what the server accepts. Limits that OpenAI's API documents
# are constants here; limits an operator may tune are settings, checked in service/prepare.py.
from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, StringConstraints, WithJsonSchema

from metering.text_rules import NO_NUL_PATTERN

# OpenAI's metadata: at most 16 pairs, keys up to 64 characters, values up to 512.
METADATA_MAX_PAIRS = 16
METADATA_KEY_MAX_CHARS = 64
METADATA_VALUE_MAX_CHARS = 512

NonEmptyStr = Annotated[str, StringConstraints(min_length=1)]


def integral(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


# Integers in strict models: JSON Schema's integer, so 8 and 8.0, never "8" or true. The
# validator comes after the bounds, so the schema states them as minimum/maximum.
AsInteger = BeforeValidator(integral)
PositiveInt = Annotated[int, Field(ge=1), AsInteger]
NonNegativeInt = Annotated[int, Field(ge=0), AsInteger]
OnlyOne = Annotated[int, Field(ge=1, le=1, description="Only 1 is supported."), AsInteger]
MetadataKey = Annotated[
    str, StringConstraints(min_length=1, max_length=METADATA_KEY_MAX_CHARS, pattern=NO_NUL_PATTERN)
]
MetadataValue = Annotated[
    str, StringConstraints(max_length=METADATA_VALUE_MAX_CHARS, pattern=NO_NUL_PATTERN)
]
METADATA_RULE = (
    f"Up to {METADATA_MAX_PAIRS} key-value pairs: keys up to {METADATA_KEY_MAX_CHARS} "
    f"characters, values up to {METADATA_VALUE_MAX_CHARS}."
)
Metadata = Annotated[
    dict[MetadataKey, MetadataValue],
    Field(max_length=METADATA_MAX_PAIRS),
    # Stated by hand: pydantic writes a key pattern as patternProperties, which leaves a key
    # that does not match it (one with a NUL) free to hold any value.
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": METADATA_MAX_PAIRS,
            "propertyNames": {
                "minLength": 1,
                "maxLength": METADATA_KEY_MAX_CHARS,
                "pattern": NO_NUL_PATTERN,
            },
            "additionalProperties": {
                "type": "string",
                "maxLength": METADATA_VALUE_MAX_CHARS,
                "pattern": NO_NUL_PATTERN,
            },
            "description": METADATA_RULE,
        }
    ),
]


# Some fields are checked beyond what JSON Schema can say: against another field, the model
# (its vocabulary, its context) or stored objects, or compiled (a grammar). The OpenAPI document
# marks each with `x-checked`, the rule that a 400 naming the field enforces; every other
# schema-valid value is accepted.
CHECKED = "x-checked"


def checked(rule: str, default: Any = None, **kwargs: Any) -> Any:
    """A field's default, with the rule the server checks beyond the field's type."""
    return Field(default, json_schema_extra={CHECKED: rule}, **kwargs)
