from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials

from gpupool import __version__
from gpupool.api.deps import ContextDep, CurrentUser, SessionDep, bearer, get_principal, plausible_token
from gpupool.api.errors import ERRORS
from gpupool.api.metrics import render
from gpupool.api.outage import StoreWatch
from gpupool.control.loop import LoopHealth
from gpupool.models.accounts import WhoAmI
from gpupool.models.system import Health, Readiness, SchedulerState, StoreState
from gpupool.services import tokens
from gpupool.services.auth import Principal
from gpupool.store.tables import QueueRow

router = APIRouter()


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """Liveness: answered on the event loop, so neither the store nor a thread pool it has blocked delays it."""
    return Health(status="ok", version=__version__)


FAILING_INTERVALS = 3
"""Cycles may fail for this many intervals (2 s at least) before the server says it is not ready."""
STALLED_INTERVALS = 10
"""A cycle that has not completed for this many intervals (30 s at least) has stalled."""


def scheduler_state(loop: LoopHealth, interval_s: float, now: float) -> SchedulerState:
    if not loop.running:
        return "stopped"
    if loop.failing_since is not None and now - loop.failing_since > max(FAILING_INTERVALS * interval_s, 2.0):
        return "failing"
    if loop.last_ok_at is None:
        return "starting"
    if loop.failing_since is None and now - loop.last_ok_at > max(STALLED_INTERVALS * interval_s, 30.0):
        return "stalled"
    return "ok" if loop.leader else "standby"


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(request: Request, ctx: ContextDep) -> JSONResponse:
    """Readiness, without a token and without detail that could help an attacker: whether the store answers
    (as the store watch last saw it, within a second) and the scheduler loop is running and not failing."""
    watch: StoreWatch = request.app.state.store_watch
    store: StoreState = "unknown" if not watch.running else "unavailable" if watch.down else "ok"
    loop = ctx.controller.loop
    scheduler = scheduler_state(loop.health(), loop.interval_s, time.monotonic())
    ready = store == "ok" and scheduler in ("ok", "standby")
    body = Readiness(status="ready" if ready else "not ready", store=store, scheduler=scheduler)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503, headers={"Cache-Control": "no-store"})


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
