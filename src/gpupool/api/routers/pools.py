from __future__ import annotations

from fastapi import APIRouter

from gpupool.api.deps import ContextDep, CurrentUser, SessionDep
from gpupool.api.errors import ERRORS
from gpupool.models.system import PoolPublic, PoolUpdate
from gpupool.services import pools

router = APIRouter(tags=["pools"], responses=ERRORS)


@router.get("/pools", response_model=list[PoolPublic])
def list_pools(session: SessionDep, who: CurrentUser) -> list[PoolPublic]:
    return pools.list_pools(session, who)


@router.patch("/pools/{name}", response_model=PoolPublic)
def update_pool(name: str, body: PoolUpdate, session: SessionDep, who: CurrentUser, ctx: ContextDep) -> PoolPublic:
    out = pools.update_pool(session, who, name, body)
    ctx.controller.wake()  # work waiting for a shareable device may start now
    return out
