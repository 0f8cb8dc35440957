# Batch lines yield to interactive requests; a killed Celery worker loses and duplicates nothing;
# a batch past its completion window ends expired with the unfinished lines in the error file.
from __future__ import annotations

import os
import signal

from tests.e2e.batches.conftest import chat_line, read_lines, submit, wait_batch
from tests.e2e.conftest import wait_until


def test_interactive_requests_overtake_the_batch_backlog(server):
    client = server.openai()
    lines = [chat_line(f"o-{i}", max_tokens=32, ignore_eos=True) for i in range(48)]
    batch = submit(client, lines)
    wait_batch(client, batch.id, until=lambda b: b.request_counts.completed >= 2)
    interactive = []
    for i in range(3):
        r = client.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": f"hi {i}"}], max_tokens=4
        )
        interactive.append(r.headers["x-request-id"])
    done = wait_batch(client, batch.id, timeout_s=90)
    assert done.status == "completed"
    batch_ids = [x["id"] for x in read_lines(client, done.output_file_id)]
    rows = {r.request_id: r for r in server.usage_rows(interactive + batch_ids)}

    def scheduled(r):
        return r.created_at.timestamp() + r.queue_ms / 1000

    for rid in interactive:
        i = rows[rid]
        overtaken = [
            b
            for b in (rows[x] for x in batch_ids)
            if b.created_at < i.created_at and scheduled(b) > scheduled(i)
        ]
        assert overtaken, f"{rid} waited behind every batch line enqueued before it"


def test_killed_celery_worker_loses_and_duplicates_nothing(server):
    client = server.openai()
    lines = [chat_line(f"k-{i}", max_tokens=6, ignore_eos=True) for i in range(30)]
    batch = submit(client, lines)
    wait_batch(client, batch.id, until=lambda b: b.request_counts.completed >= 4)
    pidfile = server.data_dir / "celery-worker.pid"
    pid = int(pidfile.read_text().strip())
    os.killpg(pid, signal.SIGKILL)  # serve restarts it; the sweep re-arms the batch's pump
    wait_until(
        lambda: pidfile.exists() and pidfile.read_text().strip() not in ("", str(pid)),
        30,
        "a new celery worker",
        0.2,
    )
    done = wait_batch(client, batch.id, timeout_s=90)
    assert done.status == "completed" and done.request_counts.completed == 30
    out = read_lines(client, done.output_file_id)
    assert sorted(x["custom_id"] for x in out) == sorted(x["custom_id"] for x in lines)
    rows = server.usage_rows([x["id"] for x in out])
    assert len(rows) == 30
    count = server.query("SELECT count(*) AS n FROM usage_records WHERE batch_id = :b", b=batch.id)[
        0
    ].n
    assert count == 30


def test_batch_past_its_window_expires(server):
    client = server.openai()
    lines = [chat_line(f"e-{i}", max_tokens=64, ignore_eos=True) for i in range(400)]
    batch = submit(client, lines, window="8s")
    done = wait_batch(client, batch.id, timeout_s=40)
    assert done.status == "expired" and done.expired_at
    out = read_lines(client, done.output_file_id)
    err = read_lines(client, done.error_file_id)
    ids = [x["custom_id"] for x in out + err]
    assert sorted(ids) == sorted(x["custom_id"] for x in lines)
    assert any((x["error"] or {}).get("code") == "batch_expired" for x in err)
