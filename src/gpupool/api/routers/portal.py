"""Sign-in, and the read models the portal draws; the portal's own files are static."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response

from gpupool.api.deps import ContextDep, CurrentUser, SessionDep, no_store
from gpupool.api.errors import ERRORS
from gpupool.api.schemas import UNIX_MAX, UNIX_MIN, LoginRequest, LoginResponse, PasswordSet, ShareLine, TimelinePoint
from gpupool.services import insight, sessions
from gpupool.services.apps import SESSION_COOKIE
from gpupool.services.auth import authenticate

router = APIRouter(tags=["portal"], responses=ERRORS)
UnixQ = Annotated[float | None, Query(description="Unix seconds", ge=UNIX_MIN, le=UNIX_MAX, allow_inf_nan=False)]


@router.post("/login", response_model=LoginResponse, dependencies=[Depends(no_store)])
def login(
    body: LoginRequest, session: SessionDep, ctx: ContextDep, request: Request, response: Response
) -> LoginResponse:
    """Trade a name and password for a session token (12 hours). The one call that needs no token. The same
    session also goes into an HttpOnly cookie that only /apps/ reads, so the browser can open notebooks."""
    secret = ctx.principals.secret or b""
    token, expiry = sessions.login(session, body.name, body.password, secret)
    who = authenticate(session, token, secret)
    assert who is not None
    response.set_cookie(
        SESSION_COOKIE, token, max_age=max(0, expiry - int(time.time())), path="/apps/", httponly=True,
        samesite="lax", secure=request.url.scheme == "https",
    )  # fmt: skip
    return LoginResponse(token=token, expires_at=expiry, name=who.name, role=who.role)


@router.put("/users/{name}/password", status_code=204)
def set_password(name: str, body: PasswordSet, session: SessionDep, who: CurrentUser) -> None:
    sessions.set_password(session, who, name, body.password)


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
