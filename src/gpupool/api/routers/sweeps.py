"""Routes of hyperparameter sweeps: Optuna studies whose trials run as workloads (gpupool.services.sweeps)."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from gpupool.api.deps import Context, ContextDep, CurrentUser, SessionDep
from gpupool.api.errors import ERRORS
from gpupool.models.sweeps import SweepCreate, SweepDetail, SweepPublic
from gpupool.services import sweeps
from gpupool.services.errors import Invalid

router = APIRouter(tags=["sweeps"], responses=ERRORS)


def _studies(ctx: Context) -> sweeps.Studies:
    if ctx.studies is None:
        raise Invalid("this server runs no sweeps")
    return ctx.studies


@router.post("/sweeps", response_model=SweepPublic, status_code=status.HTTP_201_CREATED)
def create_sweep(body: SweepCreate, session: SessionDep, ctx: ContextDep, who: CurrentUser) -> SweepPublic:
    """Members of the project. Its first trials are submitted at the leader's next cycle."""
    out = sweeps.create(session, who, body, _studies(ctx), ctx.controller.clock())
    ctx.controller.wake()
    return out


@router.get("/sweeps", response_model=list[SweepPublic])
def list_sweeps(session: SessionDep, ctx: ContextDep, who: CurrentUser) -> list[SweepPublic]:
    """The sweeps of the projects the caller reads."""
    return sweeps.list_sweeps(session, who, _studies(ctx))


@router.get("/sweeps/{project}/{name}", response_model=SweepDetail)
def describe_sweep(project: str, name: str, session: SessionDep, ctx: ContextDep, who: CurrentUser) -> SweepDetail:
    return sweeps.describe(session, who, project, name, _studies(ctx))


@router.get(
    "/sweeps/{project}/{name}/plot.png", response_class=Response, responses={200: {"content": {"image/png": {}}}}
)
def sweep_plot(project: str, name: str, session: SessionDep, ctx: ContextDep, who: CurrentUser) -> Response:
    """The optimisation history (Optuna's plot): each completed trial's value and the best so far."""
    png = sweeps.plot(session, who, project, name, _studies(ctx))
    return Response(png, media_type="image/png", headers={"Cache-Control": "no-store"})


@router.post("/sweeps/{project}/{name}/cancel", response_model=SweepPublic)
def cancel_sweep(project: str, name: str, session: SessionDep, ctx: ContextDep, who: CurrentUser) -> SweepPublic:
    """Members of the project: no new trial starts, and the running ones are stopped."""
    out = sweeps.cancel(session, who, project, name, _studies(ctx))
    ctx.controller.wake()
    return out
