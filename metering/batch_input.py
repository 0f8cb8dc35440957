# The OpenAI batch input format: JSONL of {"custom_id", "method": "POST", "url", "body"}.
# Checked once on upload (cheap structural checks); the body itself is validated per line when
# the line is admitted, so one bad body fails one line, never the batch.
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")


class MalformedFile(ValueError):
    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


@dataclass(frozen=True, slots=True)
class InputLine:
    line_no: int  # 1-based
    custom_id: str
    url: str
    body: dict[str, Any]


def parse_batch_file(content: bytes, max_lines: int) -> list[InputLine]:
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedFile(f"the file is not UTF-8: {exc}") from None
    lines: list[InputLine] = []
    seen: set[str] = set()
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        if len(lines) >= max_lines:
            raise MalformedFile(f"the file has more than {max_lines} requests", n)
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise MalformedFile(f"line {n} is not valid JSON: {exc.msg}", n) from None
        if not isinstance(obj, dict):
            raise MalformedFile(f"line {n} is not a JSON object", n)
        custom_id = obj.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            raise MalformedFile(f"line {n}: custom_id must be a non-empty string", n)
        if custom_id in seen:
            raise MalformedFile(f"line {n}: duplicate custom_id {custom_id!r}", n)
        seen.add(custom_id)
        if obj.get("method") != "POST":
            raise MalformedFile(f"line {n}: method must be POST", n)
        if obj.get("url") not in ENDPOINTS:
            raise MalformedFile(f"line {n}: url must be one of {', '.join(ENDPOINTS)}", n)
        if not isinstance(obj.get("body"), dict):
            raise MalformedFile(f"line {n}: body must be a JSON object", n)
        lines.append(InputLine(n, custom_id, obj["url"], obj["body"]))
    if not lines:
        raise MalformedFile("the file has no requests")
    return lines
