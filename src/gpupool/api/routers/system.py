from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials

from gpupool import __version__
from gpupool.api.deps import ContextDep, CurrentUser, SessionDep, bearer, get_principal, plausible_token
from gpupool.api.errors import ERRORS
from gpupool.api.metrics import render
from gpupool.models.schemas import Health, WhoAmI
from gpupool.services import tokens
from gpupool.services.auth import Principal
from gpupool.store.tables import QueueRow

router = APIRouter()


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    return Health(status="ok", version=__version__)


async def scraper_or_caller(
    request: Request,
    ctx: ContextDep,
    session: SessionDep,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal | None:
    """None for Prometheus's scrape token (a `gpm_` token an admin made: it reads /metrics, nothing else)."""
    scrape = creds is not None and creds.credentials.startswith("gpm_") and plausible_token(creds.credentials)
    if scrape and creds is not None and await run_in_threadpool(tokens.scrape_allowed, session, creds.credentials):
        return None
    return await get_principal(request, ctx, session, creds)


@router.get("/metrics", response_class=Response, responses={401: ERRORS[401]})
def metrics(
    session: SessionDep, ctx: ContextDep, who: Annotated[Principal | None, Depends(scraper_or_caller)]
) -> Response:
    body, content_type = render(session, ctx.controller, who.can_read if who is not None else lambda _: True)
    return Response(body, media_type=content_type)


@router.get("/api/v1/whoami", response_model=WhoAmI, responses={401: ERRORS[401]})
def whoami(session: SessionDep, who: CurrentUser) -> WhoAmI:
    names = sorted(q.name for q in session.query(QueueRow).filter(QueueRow.id.in_(sorted(who.project_ids))))
    departments = sorted(q.name for q in session.query(QueueRow).filter(QueueRow.id.in_(sorted(who.departments))))
    return WhoAmI(name=who.name, role=who.role, projects=names, departments=departments)
