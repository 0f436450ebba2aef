from __future__ import annotations

from fastapi import APIRouter, Response

from gpupool import __version__
from gpupool.api.deps import ContextDep, CurrentUser, SessionDep
from gpupool.api.errors import ERRORS
from gpupool.api.metrics import render
from gpupool.api.schemas import Health, WhoAmI
from gpupool.store.tables import QueueRow

router = APIRouter()


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    return Health(status="ok", version=__version__)


@router.get("/metrics", response_class=Response, responses={401: ERRORS[401]})
def metrics(session: SessionDep, ctx: ContextDep, _who: CurrentUser) -> Response:
    body, content_type = render(session, ctx.controller)
    return Response(body, media_type=content_type)


@router.get("/api/v1/whoami", response_model=WhoAmI, responses={401: ERRORS[401]})
def whoami(session: SessionDep, who: CurrentUser) -> WhoAmI:
    names = sorted(q.name for q in session.query(QueueRow).filter(QueueRow.id.in_(sorted(who.project_ids))))
    return WhoAmI(name=who.name, role=who.role, projects=names)
