from __future__ import annotations

from fastapi import APIRouter

from gpupool.api.deps import CurrentUser, SessionDep
from gpupool.api.errors import ERRORS
from gpupool.models.schemas import NodePublic
from gpupool.services.nodes import list_nodes

router = APIRouter(tags=["nodes"], responses=ERRORS)


@router.get("/nodes", response_model=list[NodePublic])
def get_nodes(session: SessionDep, who: CurrentUser) -> list[NodePublic]:
    return list_nodes(session, who)
