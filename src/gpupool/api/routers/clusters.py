"""Routes of the fleet's clusters: the hub's own and the spokes admins add, drain and remove; and when a
department's work may burst onto rented capacity."""

from __future__ import annotations

from fastapi import APIRouter, status

from gpupool.api.deps import ContextDep, CurrentUser, SessionDep
from gpupool.api.errors import ERRORS
from gpupool.models.clusters import (
    ClusterCreate,
    ClusterDetail,
    ClusterDrain,
    ClusterPublic,
    DepartmentBurstPublic,
    DepartmentBurstSet,
)
from gpupool.services import burst, clusters
from gpupool.services.clusters import Home

router = APIRouter(tags=["clusters"], responses=ERRORS)


def _home(ctx: ContextDep) -> Home:
    return Home(ctx.settings.cluster_name, ctx.settings.backend)


@router.get("/clusters", response_model=list[ClusterPublic])
def list_clusters(session: SessionDep, ctx: ContextDep, who: CurrentUser) -> list[ClusterPublic]:
    return clusters.list_clusters(session, who, _home(ctx))


@router.post("/clusters", response_model=ClusterPublic, status_code=status.HTTP_201_CREATED)
def add_cluster(body: ClusterCreate, session: SessionDep, ctx: ContextDep, who: CurrentUser) -> ClusterPublic:
    """Admins only. The hub reaches it from its next heartbeat; its nodes take work once it answers."""
    out = clusters.add(session, who, _home(ctx), body)
    ctx.controller.wake()
    return out


@router.get("/clusters/{name}", response_model=ClusterDetail)
def describe_cluster(name: str, session: SessionDep, ctx: ContextDep, who: CurrentUser) -> ClusterDetail:
    return clusters.describe(session, who, _home(ctx), name, ctx.controller.clock())


@router.post("/clusters/{name}/drain", response_model=ClusterPublic)
def drain_cluster(
    name: str, body: ClusterDrain, session: SessionDep, ctx: ContextDep, who: CurrentUser
) -> ClusterPublic:
    """A draining cluster takes no new work; what runs there runs on."""
    out = clusters.drain(session, who, _home(ctx), name, body.draining)
    ctx.controller.wake()
    return out


@router.delete("/clusters/{name}", status_code=status.HTTP_204_NO_CONTENT)
def remove_cluster(name: str, session: SessionDep, ctx: ContextDep, who: CurrentUser) -> None:
    """409 while live workloads have members there."""
    clusters.remove(session, who, _home(ctx), name)


@router.get("/departments/{name}/burst", response_model=DepartmentBurstPublic)
def get_department_burst(name: str, session: SessionDep, ctx: ContextDep, who: CurrentUser) -> DepartmentBurstPublic:
    """Whoever sees the department: its settings, and what its rented nodes cost this month."""
    return burst.get(session, who, name, ctx.controller.clock())


@router.put("/departments/{name}/burst", response_model=DepartmentBurstPublic)
def set_department_burst(
    name: str, body: DepartmentBurstSet, session: SessionDep, ctx: ContextDep, who: CurrentUser
) -> DepartmentBurstPublic:
    """Admins only: when the department's waiting work may rent burst capacity, within what monthly budget, paced
    or not, and whether its work stops at the budget."""
    return burst.set_burst(session, who, name, body, ctx.controller.clock())
