"""Routes of the volumes API: a project's volumes, created, listed and deleted by its members."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status
from fastapi.concurrency import run_in_threadpool

from gpupool.api.deps import ContextDep, CurrentUser, SessionDep
from gpupool.api.errors import ERRORS
from gpupool.models.volumes import VolumeCreate, VolumePublic
from gpupool.models.wire import Name
from gpupool.services import volumes

router = APIRouter(tags=["volumes"], responses=ERRORS)
ProjectQ = Annotated[str, Query(max_length=63)]


@router.post("/volumes", response_model=VolumePublic, status_code=status.HTTP_201_CREATED)
def create_volume(body: VolumeCreate, session: SessionDep, ctx: ContextDep, who: CurrentUser) -> VolumePublic:
    """Its storage is made at the first mount (a workload's `--volume NAME:/path`), at the size asked."""
    return volumes.create(session, who, body, ctx.settings.max_volume_gib * 2**30)


@router.get("/volumes", response_model=list[VolumePublic])
def list_volumes(project: ProjectQ, session: SessionDep, who: CurrentUser) -> list[VolumePublic]:
    return volumes.list_volumes(session, who, project)


@router.delete("/volumes/{name}", status_code=status.HTTP_204_NO_CONTENT)
async def delete_volume(name: Name, project: ProjectQ, session: SessionDep, ctx: ContextDep, who: CurrentUser) -> None:
    """Its data goes with it; 409 while a workload that has not finished mounts it."""
    await run_in_threadpool(volumes.delete, session, who, project, name, ctx.backend.capabilities().storage)
