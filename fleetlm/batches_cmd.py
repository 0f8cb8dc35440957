# `fleetlm batches submit FILE` / `fleetlm batches watch ID`: the Batch API over HTTP, with a
# plain-terminal progress bar. The key: --api-key, else the data dir's demo-key.
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

FINAL = ("completed", "failed", "expired", "cancelled")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("batches", help="submit and watch batch jobs (OpenAI Batch API)")
    actions = p.add_subparsers(dest="action", required=True)
    submit = actions.add_parser("submit", help="upload a JSONL file and create a batch")
    submit.add_argument("file", type=Path)
    submit.add_argument(
        "--endpoint",
        default="/v1/chat/completions",
        choices=("/v1/chat/completions", "/v1/completions"),
    )
    submit.add_argument("--window", default="24h", help="completion window")
    submit.add_argument("--watch", action="store_true", help="then watch it until it ends")
    watch = actions.add_parser("watch", help="show a batch's progress until it ends")
    watch.add_argument("batch_id")
    for q in (submit, watch):
        q.add_argument("--url", default=None, help="default http://HOST:PORT from the settings")
        q.add_argument("--api-key", default=None)
        q.add_argument("--data-dir", type=Path, default=None)
        q.add_argument("--timeout", type=float, default=None, help="give up watching after this")
    p.set_defaults(func=run)


def _client(args: argparse.Namespace):
    import httpx

    from service.settings import Settings

    settings = Settings()
    key = args.api_key or (args.data_dir or settings.data_dir).joinpath("demo-key").read_text()
    base = args.url or f"http://{settings.host}:{settings.port}"
    return httpx.Client(
        base_url=base.rstrip("/") + "/v1",
        headers={"Authorization": f"Bearer {key.strip()}"},
        timeout=60,
    )


def _check(r) -> dict:
    if r.status_code >= 400:
        raise SystemExit(f"fleetlm batches: HTTP {r.status_code}: {r.text}")
    return r.json()


def bar(batch: dict, width: int = 30) -> str:
    c = batch["request_counts"]
    done, total = c["completed"] + c["failed"], c["total"]
    filled = int(width * done / total) if total else 0
    return (
        f"{batch['id']} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} "
        f"({c['failed']} failed) {batch['status']}"
    )


def watch(client, batch_id: str, timeout: float | None) -> dict:
    deadline = None if timeout is None else time.monotonic() + timeout
    tty = sys.stdout.isatty()
    last = ""
    while True:
        batch = _check(client.get(f"/batches/{batch_id}"))
        line = bar(batch)
        if line != last:
            print(("\r" + line) if tty else line, end="" if tty else "\n", flush=True)
            last = line
        if batch["status"] in FINAL or (deadline is not None and time.monotonic() > deadline):
            if tty:
                print()
            for name in ("output_file_id", "error_file_id"):
                if batch.get(name):
                    print(f"{name}: {batch[name]}")
            return batch
        time.sleep(1.0)


def run(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.action == "submit":
            with args.file.open("rb") as fh:
                files = {"file": (args.file.name, fh, "application/jsonl")}
                f = _check(client.post("/files", data={"purpose": "batch"}, files=files))
            body = {
                "input_file_id": f["id"],
                "endpoint": args.endpoint,
                "completion_window": args.window,
            }
            batch = _check(client.post("/batches", json=body))
            print(json.dumps({"file_id": f["id"], "batch_id": batch["id"]}), flush=True)
            if not args.watch:
                return 0
            batch_id = batch["id"]
        else:
            batch_id = args.batch_id
        batch = watch(client, batch_id, args.timeout)
    return 0 if batch["status"] == "completed" else 1
