# GET /internal/workers (admin keys only: fleet-wide figures, not one tenant's): every live
# worker's engine stats (free KV blocks, running, waiting...).
from __future__ import annotations

from fastapi import APIRouter

from api.deps import AdminPrincipal, State
from api.openapi import AUTHED, errors
from api.relay import live_workers
from service import streams as p

router = APIRouter(tags=["internal"])

_FLOATS = {"kv_cache_usage", "updated_at", "tokens_per_s", "mean_output_tokens",
           "mean_prompt_tokens", "mean_uncached_prompt_tokens", "prefill_token_s",
           "decode_token_s", "decode_step_s",
           "oldest_waiting_s", "waiting_work_s_interactive", "waiting_work_s_batch",
           "prefill_step_s", "prefill_tok_s", "prefill_pair_s", "prefill_ahead_s_interactive",
           "prefill_ahead_s_batch", "prefill_hold_s", "interactive_share"}  # fmt: skip
_STRINGS = {"model", "limited_by"}
_FLOAT_LISTS = {"seat_finish_s"}  # comma-separated


def _typed(stats: dict[str, str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in stats.items():
        if k in _FLOAT_LISTS:
            out[k] = [float(x) for x in v.split(",") if x]
        else:
            out[k] = v if k in _STRINGS else float(v) if k in _FLOATS else int(v)
    return out


@router.get("/internal/workers", responses=errors(*AUTHED, 403))
async def workers(state: State, _: AdminPrincipal) -> dict[str, object]:
    ids = await live_workers(state.redis)
    pipe = state.redis.pipeline(transaction=False)
    for w in ids:
        pipe.hgetall(p.stats_key(w))
    stats = await pipe.execute() if ids else []
    return {"workers": [{"id": w, **_typed(s)} for w, s in zip(ids, stats)]}
