# What a worker publishes on a request's output stream for each engine delta, and what every end
# bills. The rule: a request is billed the output tokens its client received —
#   finished (stop, length)   everything the engine produced (all of it is in the stream);
#   cancelled (client gone)   what the API says the client got before it left (the cancel flag
#                             carries it), never more than the engine produced;
#   ended by the worker       (drain deadline, shutdown, Redis away past the bound) what the
#                             worker had published: Inflight.sent_tokens / confirmed_tokens;
#   taken over                the resuming worker's own end, with the first run's tokens
#                             counted in (one row: the first worker never finishes it).
# Prompt tokens are billed once whatever happens, with the cached tokens of the request's first
# run (a resumed run's cache hits are the fleet's business, not the tenant's).
from __future__ import annotations

import json
from json.encoder import encode_basestring_ascii as json_string

from engine.outputs import RequestDelta
from service.events import DeltaEvent, DoneEvent, ErrorEvent, error_event
from service.output_stream import OutputFollower
from service.streams import delivered_of
from workers.gpu.inflight import Inflight


def logprob_entries(logprobs: list) -> list[dict]:
    """Tokens' logprobs (engine.logprobs.TokenLogprob) in OpenAI's chat shape (the API reshapes
    them for completions): token text, logprob, UTF-8 bytes, top_logprobs."""
    return [
        {
            "token": lp.token,
            "logprob": lp.logprob,
            "bytes": list(lp.token.encode()),
            "top_logprobs": [
                {"token": text, "logprob": v, "bytes": list(text.encode())}
                for text, (_, v) in zip(lp.top_tokens or (), lp.top)
            ],
        }
        for lp in logprobs
    ]


def delta_event(worker_id: str, f: Inflight, delta: RequestDelta) -> DeltaEvent:
    event: DeltaEvent = {
        "type": "delta",
        "text": delta.new_text,
        "worker": worker_id,
        "completion_tokens": delta.usage.completion_tokens,
        "token_ids": delta.new_token_ids,
    }
    if not f.published:  # the first: what a worker resuming it bills and times from
        event["cached_tokens"] = delta.usage.cached_tokens
        event["first_token_time"] = delta.first_token_time
        event["scheduled_time"] = delta.first_scheduled_time
    if delta.logprobs:
        event["logprobs"] = logprob_entries(delta.logprobs)
    if delta.prompt_logprobs is not None:
        event["prompt_logprobs"] = logprob_entries(delta.prompt_logprobs)
    if f.req.sampling.n > 1:
        event["index"] = delta.index
        if delta.finish_reason is not None:
            event["finish_reason"] = delta.finish_reason
    return event


def delta_event_json(worker_id: str, f: Inflight, delta: RequestDelta) -> str:
    """delta_event's JSON as service.events.encode_event writes it, formatted directly: one per
    running request per step, and json.dumps of the dict was most of the worker's round-trip
    build time (benchmarks/exchange_cost.py). Strings go through json's own escaping."""
    if delta.logprobs or delta.prompt_logprobs is not None or f.req.sampling.n > 1:
        # rare: the plain encoder
        return json.dumps(delta_event(worker_id, f, delta), separators=(",", ":"))
    tokens = ",".join(map(str, delta.new_token_ids))
    head = (
        f'{{"type":"delta","text":{json_string(delta.new_text)},"worker":{json_string(worker_id)}'
        f',"completion_tokens":{int(delta.usage.completion_tokens)},"token_ids":[{tokens}]'
    )
    if not f.published:
        times = json.dumps([delta.first_token_time, delta.first_scheduled_time])[1:-1]
        first, scheduled = times.split(", ")
        return (
            f'{head},"cached_tokens":{int(delta.usage.cached_tokens)}'
            f',"first_token_time":{first},"scheduled_time":{scheduled}}}'
        )
    return head + "}"


def final_event(worker_id: str, f: Inflight, delta: RequestDelta) -> DoneEvent | ErrorEvent:
    """The end of a request the engine finished (or aborted on a cancel)."""
    engine_usage = delta.usage
    n = engine_usage.completion_tokens
    reason = delta.finish_reason
    if reason in ("stop", "length"):
        done: DoneEvent = {
            "type": "done",
            "text": delta.new_text,
            "worker": worker_id,
            "finish_reason": reason,
            "usage": f.usage(n, engine_usage),
        }
        if delta.logprobs:
            done["logprobs"] = logprob_entries(delta.logprobs)
        if delta.prompt_logprobs is not None:
            done["prompt_logprobs"] = logprob_entries(delta.prompt_logprobs)
        if delta.finish_reasons is not None:
            done["index"], done["finish_reasons"] = delta.index, delta.finish_reasons
        return done
    if reason == "abort":
        event = error_event("request cancelled", "cancelled")
        if f.cancel_delivered is not None:  # what the client got before it left
            n = min(n, f.cancel_delivered)
    else:
        event = error_event(delta.error or "the engine failed", "engine_error")
    return event | {"text": delta.new_text, "usage": f.usage(n, engine_usage)}


def cancelled_before_takeover(f: Inflight, follower: OutputFollower, flag: str) -> ErrorEvent:
    """A request whose worker stopped and whose client went away before another took it over:
    billed what its stream had delivered, or what the client said it got."""
    delivered = delivered_of(flag)
    n = follower.num_tokens if delivered is None else min(delivered, follower.num_tokens)
    event = error_event("request cancelled", "cancelled")
    event["usage"] = f.usage(n)
    return event
