# Small JSON schemas for the structured-output scale tests (200 requests, a 1,000-line batch):
# nested objects, arrays, enums, required fields, every value bounded (enums, small integer
# ranges, maxItems, additionalProperties false), so even a random-weight model's constrained
# answer is a few dozen tokens and always finishes within max_tokens on a CPU.
from __future__ import annotations

MAX_TOKENS = 96  # the longest answer below is ~70 characters (byte tokenizer: one per token)

SMALL_SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "kind": {"enum": ["cat", "dog"]},
            "age": {"type": "integer", "minimum": 0, "maximum": 9},
            "ok": {"type": "boolean"},
        },
        "required": ["kind", "age", "ok"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "owner": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1, "maximum": 9},
                    "role": {"enum": ["a", "b"]},
                },
                "required": ["id", "role"],
                "additionalProperties": False,
            },
            "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2},
        },
        "required": ["owner", "tags"],
        "additionalProperties": False,
    },
    {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"c": {"enum": ["r", "g", "b"]}},
            "required": ["c"],
            "additionalProperties": False,
        },
        "minItems": 1,
        "maxItems": 2,
    },
]
