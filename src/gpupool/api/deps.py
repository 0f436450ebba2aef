"""What every request needs: the app's context, a database session, and the authenticated caller."""

from __future__ import annotations

import hmac
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, HTTPException, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from gpupool.backends.base import Backend
from gpupool.control.controller import Controller
from gpupool.services.apps import SESSION_COOKIE, on_apps_host
from gpupool.services.auth import Principal, PrincipalCache, disabled_holder
from gpupool.services.sessions import CSRF_COOKIE, CSRF_HEADER, LoginLimiter, csrf_token
from gpupool.services.sso import Sso
from gpupool.services.sweeps import Studies
from gpupool.settings import Settings


@dataclass
class Context:
    settings: Settings
    sessions: sessionmaker[Session]
    backend: Backend
    controller: Controller
    principals: PrincipalCache = field(default_factory=PrincipalCache)
    limiter: LoginLimiter = field(default_factory=LoginLimiter)
    sso: Sso | None = None
    """Single sign-on with an OpenID Connect provider, where the server was started with one."""
    studies: Studies | None = None
    """Where sweeps keep their Optuna studies; None: this server runs no sweeps."""


# The dependencies are coroutines that do no blocking I/O of their own (a session connects lazily; a cached
# token costs no query), so a request hops to a worker thread once, for the use case itself, not once per
# dependency as plain functions would.


async def get_context(request: Request) -> Context:
    ctx: Context = request.app.state.ctx
    # The apps host runs tenants' pages: the API never answers there, whatever credential comes with the call.
    if ctx.settings.apps_url is not None and on_apps_host(ctx.settings, request.headers.get("host", "")):
        raise HTTPException(404, "not found: this host serves apps only, under /apps/")
    return ctx


async def get_session(ctx: Annotated[Context, Depends(get_context)]) -> AsyncIterator[Session]:
    session = ctx.sessions()
    try:
        yield session
    finally:
        session.close()  # returns the connection to the pool: a local rollback at most


# With auto_error=False a missing header, another scheme ("Basic ...") or "Bearer" alone all give None here,
# and so the same 401 below (auto_error=True would answer 403 for some of them).
bearer = HTTPBearer(auto_error=False)
MAX_TOKEN = 256


def plausible_token(token: str) -> bool:
    """Whether a token is worth looking up: printable ASCII, at most MAX_TOKEN characters. Headers arrive as
    Latin-1, so a raw byte 0xB2 becomes "²", which str.isdigit() accepts and int() refuses."""
    return 0 < len(token) <= MAX_TOKEN and token.isascii() and token.isprintable() and " " not in token


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


async def principal_of(ctx: Context, token: str) -> Principal | None:
    """Who a token names, from the cache, else from the store on a worker thread (websockets and streams, which
    authenticate outside FastAPI's dependencies)."""
    who = ctx.principals.peek(token)
    if who is None:

        def look() -> Principal | None:
            with ctx.sessions() as s:
                return ctx.principals.get(s, token)

        who = await run_in_threadpool(look)
    return who


async def get_principal(
    request: Request,
    ctx: Annotated[Context, Depends(get_context)],
    session: Annotated[Session, Depends(get_session)],
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    """The caller, from its bearer token, or else from the portal's session cookie. A request that rests on the
    cookie and changes something must echo the CSRF cookie in the X-CSRF-Token header (double submit): another
    site can make a browser send the cookie, never read it. Bearer clients (the CLI, scripts) never need it."""
    token = creds.credentials if creds is not None else request.cookies.get(SESSION_COOKIE)
    who = None
    if token is not None and plausible_token(token):
        who = ctx.principals.peek(token)
        if who is None:
            who = await run_in_threadpool(ctx.principals.get, session, token)
    if who is None:
        holder = await run_in_threadpool(disabled_holder, session, token) if token and plausible_token(token) else None
        detail = "a valid bearer token is required" if holder is None else (
            f"the user {holder!r} is disabled: an admin can enable it again"
        )  # fmt: skip
        raise HTTPException(401, detail, headers={"WWW-Authenticate": "Bearer"})
    if creds is None and token is not None and request.method not in SAFE_METHODS:
        sent, kept = request.headers.get(CSRF_HEADER, ""), request.cookies.get(CSRF_COOKIE, "")
        want = csrf_token(token)
        if not (
            hmac.compare_digest(sent.encode(), want.encode()) and hmac.compare_digest(kept.encode(), want.encode())
        ):
            raise HTTPException(
                403,
                f"a request signed in by cookie must send the {CSRF_COOKIE} cookie's value in an {CSRF_HEADER} header",
            )
    request.state.principal = who  # for the audit trail
    return who


def set_session_cookies(response: Response, request: Request, token: str, expires_at: float) -> None:
    """The browser's session: the token in an HttpOnly cookie (the API, the portal and /apps/ read it; no page
    script can), and its CSRF token in a cookie the portal's script reads and echoes. Secure over HTTPS."""
    age, secure = max(0, int(expires_at - time.time())), request.url.scheme == "https"
    response.set_cookie(SESSION_COOKIE, token, max_age=age, path="/", httponly=True, samesite="lax", secure=secure)
    response.set_cookie(CSRF_COOKIE, csrf_token(token), max_age=age, path="/", samesite="strict", secure=secure)


def clear_session_cookies(response: Response) -> None:
    response.delete_cookie(SESSION_COOKIE, path="/")
    response.delete_cookie(SESSION_COOKIE, path="/apps/")  # where servers before this one kept it
    response.delete_cookie(CSRF_COOKIE, path="/")


async def no_store(response: Response) -> None:
    """For routes whose answer carries a token: no cache (a browser's, a proxy's) may keep it."""
    response.headers["Cache-Control"] = "no-store"


ContextDep = Annotated[Context, Depends(get_context)]
SessionDep = Annotated[Session, Depends(get_session)]
CurrentUser = Annotated[Principal, Depends(get_principal)]
