# vLLM's engine control endpoints, with its names (admin keys only; load tools such as aiperf call
# them: --reset-kv-cache, --server-profiler): every live worker acts on its next loop turn and
# answers (api/control.py). vLLM answers with an empty 200; these add what was done.
#   POST /reset_prefix_cache  drop every cached prefix block no running request holds
#   POST /start_profile       start a torch profiler around each worker's engine steps
#   POST /stop_profile        stop it; each worker writes a Chrome trace under the data directory
from __future__ import annotations

from fastapi import APIRouter

from api.control import broadcast
from api.deps import AdminPrincipal, State
from api.openapi import AUTHED, errors
from service.errors import APIError

router = APIRouter(tags=["engine control"])
# an admin key; a worker failed the command, or none is alive or answered in time
ERRORS = errors(*AUTHED, 403, 500, 503)


@router.post("/reset_prefix_cache", responses=ERRORS)
async def reset_prefix_cache(state: State, _: AdminPrincipal) -> dict[str, object]:
    replies = await broadcast(state.redis, "reset_prefix_cache", state.settings.control_timeout_s)
    workers = [{"worker": r.worker, "freed_blocks": r.result["freed_blocks"]} for r in replies]
    return {"freed_blocks": sum(w["freed_blocks"] for w in workers), "workers": workers}


@router.post("/start_profile", responses=ERRORS)
async def start_profile(state: State, _: AdminPrincipal) -> dict[str, object]:
    replies = await broadcast(state.redis, "start_profile", state.settings.control_timeout_s)
    return {"workers": [{"worker": r.worker, "started": r.result["started"]} for r in replies]}


@router.post("/stop_profile", responses=ERRORS | errors(409))
async def stop_profile(state: State, _: AdminPrincipal) -> dict[str, object]:
    replies = await broadcast(state.redis, "stop_profile", state.settings.control_timeout_s)
    workers = [{"worker": r.worker, "trace": r.result["trace"]} for r in replies]
    traces = [w["trace"] for w in workers if w["trace"]]
    if not traces:
        raise APIError(409, "no worker was profiling: POST /start_profile first", code="conflict")
    return {"traces": traces, "workers": workers}
