# What text the service accepts, so that storage never fails on it: Postgres text columns refuse
# NUL, psycopg (and every UTF-8 encoder: tokenizers, JSON responses) refuses unpaired surrogates,
# and every column has a length. The HTTP edge and the batch input checks apply these rules
# before anything reaches the database; a failure names the rule, the caller names the field.
from __future__ import annotations

import re
from typing import Any

from sqlalchemy.orm import InstrumentedAttribute

# Surrogates only enter a str through JSON \uXXXX escapes (valid UTF-8 cannot carry them); a
# pair is joined by the JSON decoder, so any surrogate left in a decoded str is unpaired.
_SURROGATE = re.compile("[\ud800-\udfff]")
NO_NUL_PATTERN = r"^[^\x00]*$"  # for schemas: JSON Schema (ECMA) and pydantic read it alike


def column_length(column: InstrumentedAttribute) -> int:
    """The declared length of a String column: the longest value it stores."""
    return column.type.length


def text_problem(value: str, max_chars: int | None = None) -> str | None:
    """Why `value` cannot be stored, or None."""
    if "\x00" in value:
        return "must not contain NUL (\\u0000) characters"
    if _SURROGATE.search(value):
        return "must not contain unpaired UTF-16 surrogates"
    if max_chars is not None and len(value) > max_chars:
        return f"must be at most {max_chars} characters"
    return None


def unpaired_surrogate_path(value: Any) -> str | None:
    """The dotted path ("messages.0.content") of the first string, or object key, in a decoded
    JSON value that holds an unpaired surrogate; "" for the value itself; None when clean.
    Iterative: a deeply nested document must not exhaust the stack."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return _SURROGATE.sub("\ufffd", path)
        elif isinstance(item, dict):
            for key, child in reversed(item.items()):
                child_path = f"{path}.{key}" if path else key
                if _SURROGATE.search(key):
                    return _SURROGATE.sub("\ufffd", child_path)
                stack.append((child, child_path))
        elif isinstance(item, list):
            for i in range(len(item) - 1, -1, -1):
                stack.append((item[i], f"{path}.{i}" if path else str(i)))
    return None
