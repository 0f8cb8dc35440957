# GET /v1/models, GET /v1/models/{id}
from __future__ import annotations

from fastapi import APIRouter

from api.deps import CurrentPrincipal, State
from api.openapi import AUTHED, errors
from service.prepare import check_model
from service.schemas.models import ModelCard, ModelList

router = APIRouter(tags=["models"])


@router.get("/v1/models", responses=errors(*AUTHED))
async def list_models(state: State, _: CurrentPrincipal) -> ModelList:
    return ModelList(data=[state.model_card])


@router.get("/v1/models/{model_id:path}", responses=errors(*AUTHED, 404))
async def get_model(model_id: str, state: State, _: CurrentPrincipal) -> ModelCard:
    check_model(state, model_id)
    return state.model_card
