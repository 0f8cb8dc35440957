# Open-loop HTTP load against any OpenAI-compatible server: each request leaves at its scheduled
# time (t0 + arrival) whatever happened to earlier ones, streams, and is timed at the client per
# content chunk. The schedule is dealt over several client processes (request i to process
# i % n), so the client's own parsing never becomes what delays a chunk.
from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fleetlm.bench.latency import RequestRecord
from fleetlm.bench.workloads import BenchRequest

# Prompt text for the chat endpoint: token id → a word, so the same ids give the same text and
# shared system prompts stay shared prefixes.
_TEXT = (
    "the of and to in is that for it as with was on be by at this are from or an which but not "
    "have one all were can their there been if more when will would who so no time out up use "
    "about many then them these some her him into has two like other could than first water"
)
_WORDS = _TEXT.split()


@dataclass(frozen=True, slots=True)
class Target:
    base_url: str  # ending in /v1
    api_key: str
    model: str
    endpoint: str = "completions"  # "completions" (token-id prompts) | "chat" (text prompts)
    request_timeout_s: float = 600.0
    ignore_eos: bool = True
    extra_body: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.endpoint not in ("completions", "chat"):
            raise ValueError(f"endpoint must be 'completions' or 'chat', got {self.endpoint!r}")


def ids_to_text(ids: list[int]) -> str:
    return "".join(" " + _WORDS[t % len(_WORDS)] for t in ids)


def _error_code(body: bytes) -> str:
    """ ":<code>" of an OpenAI-shaped error body (which 503 it was: queue_full, overloaded,
    no_worker, ...), or "" when the body is not one."""
    try:
        err = json.loads(body).get("error") or {}
    except (ValueError, AttributeError):
        return ""
    code = err.get("code") if isinstance(err, dict) else None
    return f":{code}" if code else ""


def request_body(target: Target, r: BenchRequest) -> dict:
    body: dict = {
        "model": target.model,
        "max_tokens": r.max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if target.endpoint == "completions":
        body["prompt"] = r.prompt_ids
    else:
        shared = r.num_shared_tokens
        body["messages"] = [
            {"role": "system", "content": ids_to_text(r.prompt_ids[:shared])},
            {"role": "user", "content": ids_to_text(r.prompt_ids[shared:]) or " hello"},
        ]
    if target.ignore_eos:
        body["ignore_eos"] = True
    if r.priority == "batch":
        body["service_tier"] = "flex"
    return body | target.extra_body


def _chunk_text(choice: dict) -> str:
    text = choice.get("text")
    if text is None:
        text = (choice.get("delta") or {}).get("content")
    return text or ""


async def _send(session, target: Target, index: int, r: BenchRequest, t0: float, counters):
    import aiohttp

    rec = RequestRecord(index, r.priority, r.arrival_s, len(r.prompt_ids))
    await asyncio.sleep(max(0.0, t0 + r.arrival_s - time.time()))
    counters[0] += 1
    path = "completions" if target.endpoint == "completions" else "chat/completions"
    url = f"{target.base_url}/{path}"
    headers = {"Authorization": f"Bearer {target.api_key}"}
    chunks = 0
    finished = False
    try:
        async with session.post(url, json=request_body(target, r), headers=headers) as resp:
            rec.request_id = resp.headers.get("x-request-id")
            if (predicted := resp.headers.get("x-fleetlm-predicted-ttft")) is not None:
                rec.predicted_ttft_s = float(predicted)
            if resp.status != 200:
                rec.status = f"http_{resp.status}" + _error_code(await resp.read())
                rec.retry_after = resp.headers.get("retry-after")
                return rec
            async for line in resp.content:
                if not line.startswith(b"data: "):
                    continue
                payload = line[6:].strip()
                if payload == b"[DONE]":
                    break
                now = time.time() - t0
                obj = json.loads(payload)
                if "error" in obj:
                    err = obj["error"] or {}
                    rec.status = f"error:{err.get('code') or err.get('type') or 'unknown'}"
                    rec.num_output = max(rec.num_output, chunks)  # generated, not completed
                    return rec
                for choice in obj.get("choices") or ():
                    if _chunk_text(choice):
                        chunks += 1
                        rec.token_times.append(now)
                        if rec.first_token_s is None:
                            rec.first_token_s = now
                        rec.finish_s = now
                    if choice.get("finish_reason"):
                        finished = True
                usage = obj.get("usage")
                if usage:
                    rec.num_output = int(usage.get("completion_tokens") or 0)
                    details = usage.get("prompt_tokens_details") or {}
                    rec.num_cached = int(details.get("cached_tokens") or 0)
                    rec.num_prompt = int(usage.get("prompt_tokens") or rec.num_prompt)
        if not rec.num_output:
            rec.num_output = chunks  # a server without stream usage: count chunks
        rec.status = "ok" if finished else "incomplete"
    except asyncio.CancelledError:
        rec.status = "timeout"
    except (aiohttp.ClientError, OSError) as exc:
        rec.status = f"client_error:{type(exc).__name__}"
    except ValueError:
        rec.status = "client_error:bad_json"
    finally:
        counters[1] += 1
        if rec.status != "ok":
            counters[2] += 1
    return rec


async def _run(target: Target, work: list[tuple[int, BenchRequest]], t0: float, deadline: float,
               counters) -> list[RequestRecord]:  # fmt: skip
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=target.request_timeout_s, sock_connect=30)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        tasks = [asyncio.create_task(_send(session, target, i, r, t0, counters)) for i, r in work]
        _, late = await asyncio.wait(tasks, timeout=max(1.0, deadline - time.time()))
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
    return [t.result() for t in tasks if not t.cancelled()]


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _client_process(k, target, work, t0, deadline, shared, results) -> None:
    _raise_fd_limit()

    class Counters:  # sent, done, failed: this process's slots in the shared array
        def __init__(self, base: int) -> None:
            self.base = base

        def __getitem__(self, k: int) -> int:
            return shared[self.base + k]

        def __setitem__(self, k: int, v: int) -> None:
            shared[self.base + k] = v

    records = asyncio.run(_run(target, work, t0, deadline, Counters(3 * k)))
    results.put((k, records))


def run_schedule(
    target: Target,
    requests: list[BenchRequest],
    *,
    num_processes: int = 2,
    drain_timeout_s: float = 180.0,
    start_delay_s: float = 2.0,
    progress: Callable[[int, int, int, int], None] | None = None,
) -> tuple[list[RequestRecord], float]:
    """Send every request at its arrival offset from a common start; returns the records in
    traffic order (requests still running drain_timeout_s after the last arrival end as
    "timeout") and the start time (time.time())."""
    n = max(1, min(num_processes, len(requests)))
    ctx = mp.get_context("spawn")
    shared = ctx.Array("q", 3 * n, lock=False)
    results = ctx.Queue()
    t0 = time.time() + start_delay_s  # every process is up before the first arrival
    last = max((r.arrival_s for r in requests), default=0.0)
    deadline = t0 + last + drain_timeout_s
    procs = []
    for k in range(n):
        work = [(i, r) for i, r in enumerate(requests) if i % n == k]
        proc = ctx.Process(
            target=_client_process, args=(k, target, work, t0, deadline, shared, results),
            daemon=True,
        )  # fmt: skip
        proc.start()
        procs.append(proc)
    gathered: dict[int, list[RequestRecord]] = {}
    while len(gathered) < n:
        try:
            k, records = results.get(timeout=0.5)
            gathered[k] = records
        except Exception:  # queue.Empty: report progress, notice dead clients
            if all(not p.is_alive() for p in procs) and results.empty():
                break
        if progress is not None:
            sent, done, failed = (sum(shared[3 * k + j] for k in range(n)) for j in range(3))
            progress(sent, done, failed, len(requests))
    for proc in procs:
        proc.join(timeout=10)
    if len(gathered) < n:
        print("fleetlm bench: a client process died; its requests count as lost", file=sys.stderr)
    by_index = {rec.index: rec for records in gathered.values() for rec in records}
    out = []
    for i, r in enumerate(requests):
        rec = by_index.get(i)
        if rec is None:
            rec = RequestRecord(i, r.priority, r.arrival_s, len(r.prompt_ids), status="lost")
        out.append(rec)
    return out, t0
