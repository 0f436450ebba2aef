"""Sign-in, and the read models the portal draws; the portal's own files are static."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse

from gpupool.api.deps import ContextDep, CurrentUser, SessionDep, no_store
from gpupool.api.errors import ERRORS
from gpupool.models.accounts import LoginRequest, LoginResponse, PasswordSet
from gpupool.models.schemas import ShareLine, TimelinePoint
from gpupool.models.wire import UNIX_MAX, UNIX_MIN
from gpupool.services import audit, insight, sessions
from gpupool.services.apps import SESSION_COOKIE

router = APIRouter(tags=["portal"], responses=ERRORS)
UnixQ = Annotated[float | None, Query(description="Unix seconds", ge=UNIX_MIN, le=UNIX_MAX, allow_inf_nan=False)]


@router.post("/login", response_model=LoginResponse, dependencies=[Depends(no_store)])
def login(body: LoginRequest, session: SessionDep, ctx: ContextDep, request: Request, response: Response) -> Response:
    """Trade a name and password for a session token (12 hours). The one call that needs no token. The same
    session also goes into an HttpOnly cookie that only /apps/ reads, so the browser can open notebooks."""
    audit.note(actor=body.name)
    address = request.client.host if request.client else "?"
    try:
        token, expiry, who = sessions.login(session, body.name, body.password, address, ctx.limiter)
    except sessions.TooManyAttempts as e:
        return JSONResponse({"detail": e.message}, 429, headers={"Retry-After": str(e.retry_after_s)})
    out = LoginResponse(token=token, expires_at=expiry, name=who.name, role=who.role)
    answer = JSONResponse(out.model_dump(), headers={"Cache-Control": "no-store"})
    answer.set_cookie(
        SESSION_COOKIE, token, max_age=max(0, int(expiry - time.time())), path="/apps/", httponly=True,
        samesite="lax", secure=request.url.scheme == "https",
    )  # fmt: skip
    return answer


@router.post("/logout", status_code=204)
def logout(session: SessionDep, ctx: ContextDep, who: CurrentUser, response: Response) -> None:
    """End the session (or revoke the token) this request came with."""
    sessions.logout(session, who)
    ctx.principals.clear()
    response.delete_cookie(SESSION_COOKIE, path="/apps/")


@router.put("/users/{name}/password", status_code=204)
def set_password(name: str, body: PasswordSet, session: SessionDep, ctx: ContextDep, who: CurrentUser) -> None:
    """Your own needs your current password, and ends your other sessions; an admin may set anyone's."""
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
