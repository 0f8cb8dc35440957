# What storage accepts, checked before it is asked: NUL, unpaired surrogates and column lengths;
# tenant names (a documented charset and length); batch input lines; CSV cells a spreadsheet
# would run as formulas.
from __future__ import annotations

import json
import uuid

import pytest

from metering.batch_input import CUSTOM_ID_MAX_CHARS, check_batch_file, parse_batch_file
from metering.db import transaction
from metering.reports import to_csv
from metering.tenants import TenantError, create_tenant, list_tenants
from metering.text_rules import text_problem, unpaired_surrogate_path


def test_text_problems():
    assert text_problem("fine", 4) is None
    assert "NUL" in text_problem("a\x00", 10)
    assert "surrogates" in text_problem("a\udc00", 10)
    assert "at most 3" in text_problem("abcd", 3)
    assert text_problem("\U0001f642") is None


def test_unpaired_surrogate_paths():
    assert unpaired_surrogate_path({"a": [1, "ok", {"b": "x\ud800"}]}) == "a.2.b"
    assert unpaired_surrogate_path({"\udfff": 1}) == "\ufffd"
    assert unpaired_surrogate_path("\ud800") == ""
    assert unpaired_surrogate_path({"a": ["\U0001f642"]}) is None
    deep: list = []
    for _ in range(50_000):  # no recursion: no RecursionError
        deep = [deep]
    assert unpaired_surrogate_path(deep) is None


@pytest.mark.parametrize(
    "name", ["", "tenA ", " tenA", "a\nb", "evil\u202egpj", "a" * 65, "-x", "=cmd", "a/b"]
)
def test_tenant_names_have_a_charset_and_length(db, name):
    with pytest.raises(TenantError, match="invalid tenant name"), transaction(db) as s:
        create_tenant(s, name)


def test_valid_tenant_names(db):
    u = uuid.uuid4().hex[:8]
    names = [u, f"Acme.prod_2-eu-{u}", "x" * 56 + u]
    with transaction(db) as s:
        for name in names:
            create_tenant(s, name)
        assert set(names) <= {t["tenant"] for t in list_tenants(s)}


def test_csv_cells_that_start_a_formula_are_neutralised():
    lines = [{"model": m, "requests": 1, "cost": "0.0"} for m in ("=1+2", "+x", "-x", "@x", "ok")]
    rows = to_csv(lines, ("model",)).splitlines()[1:]
    assert [r.split(",")[0] for r in rows] == ["'=1+2", "'+x", "'-x", "'@x", "ok"]


def line(custom_id, url="/v1/chat/completions", **extra) -> str:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    obj = {"custom_id": custom_id, "method": "POST", "url": url, "body": body, **extra}
    return json.dumps(obj, ensure_ascii=False)


def test_batch_files_are_split_on_newlines_only():
    inner = line("a").replace('"hi"', '"x\u2028y\u2029z\u0085w"')
    content = f"{inner}\r\n\n  \n{line('b')}".encode()
    lines = parse_batch_file(content, max_lines=10)
    assert [(x.line_no, x.custom_id) for x in lines] == [(1, "a"), (4, "b")]
    assert lines[0].body["messages"][0]["content"] == "x\u2028y\u2029z\u0085w"


def test_every_bad_line_is_reported():
    content = "\n".join(
        [
            line("ok"),
            line("c" * (CUSTOM_ID_MAX_CHARS + 1)),
            "not json",
            line("ok"),
            line("other", url="/v1/completions"),
        ]
    ).encode()
    lines, problems = check_batch_file(content, 10, endpoint="/v1/chat/completions")
    assert [x.custom_id for x in lines] == ["ok"]
    assert [p.line for p in problems] == [2, 3, 4, 5]
    assert "custom_id must be at most" in str(problems[0])
    assert "duplicate" in str(problems[2]) and problems[2].custom_id == "ok"
    assert "differs from the batch's endpoint" in str(problems[3])
    _, too_many = check_batch_file("\n".join(line(str(i)) for i in range(5)).encode(), 3)
    assert "more than 3 requests" in str(too_many[-1])
