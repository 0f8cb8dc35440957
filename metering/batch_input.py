# The OpenAI batch input format: JSONL of {"custom_id", "method": "POST", "url", "body"}.
# Checked on upload (the first bad line refuses the file) and again by the batch pump (every bad
# line is reported, and the batch fails): structure, and every string against what storage takes
# (metering/text_rules.py), so that no line can fail its INSERT. The body itself is validated per
# line when the line is admitted, so one bad body fails one line, never the batch.
#
# Lines are split on "\n" only: JSON strings may hold U+2028, U+0085 and the other characters
# str.splitlines() also breaks on, and a trailing "\r" is JSON whitespace.
from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from metering.batch_models import BatchRequest
from metering.text_rules import column_length, text_problem, unpaired_surrogate_path

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
CUSTOM_ID_MAX_CHARS = column_length(BatchRequest.custom_id)


class MalformedFile(ValueError):
    def __init__(self, message: str, line: int | None = None, custom_id: str | None = None):
        super().__init__(message)
        self.line = line
        self.custom_id = custom_id


@dataclass(frozen=True, slots=True)
class InputLine:
    line_no: int  # 1-based
    custom_id: str
    url: str
    body: dict[str, Any]


def _decode(content: bytes) -> str:
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedFile(f"the file is not UTF-8: {exc}") from None


def _numbered_lines(text: str) -> Iterator[tuple[int, str]]:
    for n, raw in enumerate(text.split("\n"), start=1):
        if raw.strip(" \t\r"):
            yield n, raw


def _line(n: int, raw: str, endpoint: str | None) -> InputLine:
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not valid JSON"
        raise MalformedFile(f"line {n} is not valid JSON: {reason}", n) from None
    if not isinstance(obj, dict):
        raise MalformedFile(f"line {n} is not a JSON object", n)
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise MalformedFile(f"line {n}: custom_id must be a non-empty string", n)
    problem = text_problem(custom_id, CUSTOM_ID_MAX_CHARS)
    if problem is not None:
        raise MalformedFile(f"line {n}: custom_id {problem}", n)
    path = unpaired_surrogate_path(obj)
    if path is not None:
        message = f"line {n}: {path} must not contain unpaired UTF-16 surrogates"
        raise MalformedFile(message, n, custom_id)
    if obj.get("method") != "POST":
        raise MalformedFile(f"line {n}: method must be POST", n, custom_id)
    url = obj.get("url")
    if url not in ENDPOINTS:
        raise MalformedFile(f"line {n}: url must be one of {', '.join(ENDPOINTS)}", n, custom_id)
    if endpoint is not None and url != endpoint:
        message = f"line {n}: url {url} differs from the batch's endpoint {endpoint}"
        raise MalformedFile(message, n, custom_id)
    if not isinstance(obj.get("body"), dict):
        raise MalformedFile(f"line {n}: body must be a JSON object", n, custom_id)
    return InputLine(n, custom_id, url, obj["body"])


def check_batch_file(
    content: bytes, max_lines: int, endpoint: str | None = None
) -> tuple[list[InputLine], list[MalformedFile]]:
    """Every line checked: the good lines and a problem for each bad one (a file-level problem
    alone when the file cannot be read as lines at all). `endpoint`: every url must be it."""
    try:
        text = _decode(content)
    except MalformedFile as exc:
        return [], [exc]
    lines: list[InputLine] = []
    problems: list[MalformedFile] = []
    seen: set[str] = set()
    for count, (n, raw) in enumerate(_numbered_lines(text), start=1):
        if count > max_lines:
            too_many = MalformedFile(f"the file has more than {max_lines} requests", n)
            return lines, [*problems, too_many]
        try:
            line = _line(n, raw, endpoint)
        except MalformedFile as exc:
            problems.append(exc)
            continue
        if line.custom_id in seen:
            message = f"line {n}: duplicate custom_id {line.custom_id!r}"
            problems.append(MalformedFile(message, n, line.custom_id))
            continue
        seen.add(line.custom_id)
        lines.append(line)
    if not lines and not problems:
        problems.append(MalformedFile("the file has no requests"))
    return lines, problems


def parse_batch_file(content: bytes, max_lines: int) -> list[InputLine]:
    """The upload's check: the lines, or the first problem raised."""
    lines, problems = check_batch_file(content, max_lines)
    if problems:
        raise problems[0]
    return lines
