# `fleetlm batches submit --watch` and `fleetlm batches watch` against the running server.
from __future__ import annotations

import json

from tests.e2e.batches.conftest import chat_line, jsonl, read_lines


def test_submit_and_watch_from_the_terminal(server, tmp_path):
    lines = [chat_line(f"cli-{i}", max_tokens=3) for i in range(5)]
    path = tmp_path / "requests.jsonl"
    path.write_bytes(jsonl(lines))
    out = server.cli("batches", "submit", str(path), "--watch", "--timeout", "90", timeout_s=120)
    first, *progress = out.strip().splitlines()
    ids = json.loads(first)
    assert ids["batch_id"].startswith("batch_") and ids["file_id"].startswith("file-")
    # Without a terminal, each change of progress is one line; the last one is final.
    assert any(line.startswith(ids["batch_id"]) and "completed" in line for line in progress)
    assert any(line.startswith(f"{ids['batch_id']} [") and "5/5" in line for line in progress)
    output_file = next(line.split(": ")[1] for line in progress if line.startswith("output_file"))
    got = read_lines(server.openai(), output_file)
    assert sorted(x["custom_id"] for x in got) == sorted(x["custom_id"] for x in lines)

    again = server.cli("batches", "watch", ids["batch_id"]).strip().splitlines()
    assert "5/5 (0 failed) completed" in again[0]
