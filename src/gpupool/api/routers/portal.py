"""Sign-in, and the read models the portal draws; the portal's own files are static."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials

from gpupool.api.deps import (
    ContextDep,
    CurrentUser,
    SessionDep,
    bearer,
    clear_session_cookies,
    no_store,
    set_session_cookies,
)
from gpupool.api.errors import ERRORS
from gpupool.models.accounts import LoginRequest, LoginResponse, PasswordSet
from gpupool.models.metrics import WorkloadMetrics
from gpupool.models.schemas import ShareLine, TimelinePoint
from gpupool.models.wire import UNIX_MAX, UNIX_MIN
from gpupool.services import audit, insight, metrics, sessions
from gpupool.services.apps import SESSION_COOKIE
from gpupool.services.auth import require_own_login
from gpupool.services.sessions import SESSION_PREFIX

router = APIRouter(tags=["portal"], responses=ERRORS)
UnixQ = Annotated[float | None, Query(description="Unix seconds", ge=UNIX_MIN, le=UNIX_MAX, allow_inf_nan=False)]


@router.post("/login", response_model=LoginResponse, dependencies=[Depends(no_store)])
def login(body: LoginRequest, session: SessionDep, ctx: ContextDep, request: Request, response: Response) -> Response:
    """Trade a name and password for a session token (12 hours). The one call that needs no token. The same
    session also goes into an HttpOnly cookie (the browser's session: the portal's calls and /apps/), with a CSRF
    cookie that the portal echoes in an X-CSRF-Token header on the calls that change something."""
    audit.note(actor=body.name)
    address = request.client.host if request.client else "?"
    try:
        token, expiry, who = sessions.login(session, body.name, body.password, address, ctx.limiter)
    except sessions.TooManyAttempts as e:
        return JSONResponse({"detail": e.message}, 429, headers={"Retry-After": str(e.retry_after_s)})
    out = LoginResponse(token=token, expires_at=expiry, name=who.name, role=who.role)
    answer = JSONResponse(out.model_dump(), headers={"Cache-Control": "no-store"})
    set_session_cookies(answer, request, token, expiry)
    return answer


@router.post("/session", response_model=LoginResponse, dependencies=[Depends(no_store)])
async def cookie_session(
    who: CurrentUser, request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> Response:
    """The portal's sign-in with a token (an API token or a session): the same token, sent once as a bearer
    token, goes into the browser's session cookies, so the page keeps no token of its own. Only the user's whole
    identity: apps opened from the portal get sessions of their own from the cookie (`apps.mint_ticket`)."""
    if creds is None:
        return JSONResponse({"detail": "send the token to keep as a bearer token"}, 400)
    require_own_login(who, "open sessions")
    expiry = time.time() + sessions.SESSION_TTL_S  # the cookie's life; the token's own is checked on each call
    out = LoginResponse(token=creds.credentials, expires_at=expiry, name=who.name, role=who.role)
    answer = JSONResponse(out.model_dump(), headers={"Cache-Control": "no-store"})
    set_session_cookies(answer, request, creds.credentials, expiry)
    return answer


@router.post("/logout", status_code=204)
def logout(session: SessionDep, ctx: ContextDep, who: CurrentUser, request: Request, response: Response) -> None:
    """End the session (or revoke the token) this request came with, and clear the browser's session cookies.
    A browser signed in with an API token only forgets it: the token goes on working for its other users."""
    cookie = request.cookies.get(SESSION_COOKIE, "")
    if "authorization" in request.headers or cookie.startswith(SESSION_PREFIX):
        sessions.logout(session, who)
        ctx.principals.clear()
    clear_session_cookies(response)


@router.put("/users/{name}/password", status_code=204)
def set_password(name: str, body: PasswordSet, session: SessionDep, ctx: ContextDep, who: CurrentUser) -> None:
    """Your own needs your current password, and ends your other sessions; an admin may set anyone's. Never
    from a workload's, a service or a narrowed token: only from your own login."""
    audit.note(obj=f"user/{name}")
    sessions.set_password(session, who, name, body.password, body.current)
    ctx.principals.clear()


@router.get("/shares", response_model=list[ShareLine])
def get_shares(session: SessionDep, ctx: ContextDep, who: CurrentUser) -> list[ShareLine]:
    return insight.shares(session, who, ctx.controller.last_decision)


@router.get("/reports/timeline", response_model=list[TimelinePoint])
def get_timeline(
    session: SessionDep,
    who: CurrentUser,
    start: UnixQ = None,
    end: UnixQ = None,
) -> list[TimelinePoint]:
    now = time.time()
    return insight.timeline(session, who, start if start is not None else now - 3600, end if end is not None else now)


@router.get("/workloads/{ref}/metrics", response_model=WorkloadMetrics)
def get_workload_metrics(
    ref: str,
    session: SessionDep,
    who: CurrentUser,
    project: Annotated[str | None, Query(max_length=63, description="Its project, where the name is ambiguous")] = None,
    start: UnixQ = None,
    end: UnixQ = None,
) -> WorkloadMetrics:
    """A workload's GPU use per minute (GPUs held, busy percent, peak GPU memory), by default over the last
    hour: the history its page charts before adding the live samples."""
    now = time.time()
    stop = end if end is not None else now
    return metrics.workload_metrics(session, who, ref, project, start if start is not None else stop - 3600, stop)
