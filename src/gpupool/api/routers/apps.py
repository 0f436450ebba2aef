"""The app proxy: a workload's notebook or inference service at /apps/<project>/<name>/, for HTTP and websockets
alike, and only for callers the server has authenticated (jupyter-server-proxy's CVE-2024-28179 let websocket
upgrades through unauthenticated; here both go through `_caller` and `apps.resolve`).

The caller's gpupool credentials (bearer token, session cookie) are stripped before the request goes on: the
app is the tenant's code and must never see them.

With `apps_url` set, apps are served on the apps host alone, which reads bearer tokens, API keys and its own
cookie (`apps.APP_COOKIE`), never the portal's session. The portal's host answers /apps/ with a redirect there:
for a browser signed in to the portal, through /apps/_auth and a single-use ticket (`apps.mint_ticket`). A
ticket is minted only for a navigation that starts on the portal's own origin (or is typed); one that another
site (an app's page, say) starts gets a page asking the user to open the app, so that a tenant's page cannot
sign its viewer in to another tenant's app behind their back.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
from collections.abc import AsyncIterator, Mapping
from typing import Annotated
from urllib.parse import quote, urlencode

import httpx
from fastapi import APIRouter, Query, Request, WebSocket
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.websockets import WebSocketDisconnect
from websockets.asyncio.client import ClientConnection, connect, unix_connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from gpupool.api.deps import Context, plausible_token, principal_of
from gpupool.backends import appsock
from gpupool.backends.base import AppEndpoint
from gpupool.services import apps, tokens
from gpupool.services.auth import Principal
from gpupool.services.errors import ServiceError
from gpupool.services.sessions import CSRF_COOKIE

router = APIRouter(include_in_schema=False)

_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding",
     "upgrade", "host", "content-length"}
)  # fmt: skip
_WS_DROP = frozenset(
    {"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions", "sec-websocket-protocol"}
)
_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
_OURS_TO_SET = frozenset({"server", "date"})
"""Headers of an app's answer that the server sets itself (uvicorn adds both to every answer, and does not look at
what the app sent): passed on, each would come twice. The proxy's own win, as nginx's do."""


OURS = ("gp_", "gps_", "gpk_", apps.APP_SESSION_PREFIX, apps.TICKET_PREFIX)
"""Credentials gpupool issues: never passed on to an app."""
_OUR_COOKIES = frozenset({apps.SESSION_COOKIE, CSRF_COOKIE, apps.APP_COOKIE})


def _bearer(headers: Mapping[str, str]) -> str | None:
    scheme, _, value = headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.startswith(OURS) else None


def _credential(headers: Mapping[str, str], cookies: Mapping[str, str]) -> str | None:
    return _bearer(headers) or cookies.get(apps.SESSION_COOKIE)


async def _caller(
    ctx: Context, headers: Mapping[str, str], cookies: Mapping[str, str], project: str, name: str
) -> Principal | None:
    """Who calls: by bearer token anywhere; by the portal's session cookie on the portal's host (apps sharing its
    origin); by the apps host's own cookie there, for the one app it was made for."""
    if apps.on_apps_host(ctx.settings, headers.get("host", "")):
        cookie = cookies.get(apps.APP_COOKIE)
        if _bearer(headers) is None and cookie is not None and plausible_token(cookie):

            def app_session() -> Principal | None:
                with ctx.sessions() as s:
                    return apps.app_session_caller(s, cookie, project, name)

            return await run_in_threadpool(app_session)
        return await _token_caller(ctx, _bearer(headers))
    return await _token_caller(ctx, _credential(headers, cookies))


async def _token_caller(ctx: Context, token: str | None) -> Principal | None:
    if token is None or not plausible_token(token) or not token.startswith(("gp_", "gps_")):
        return None
    return await principal_of(ctx, token)


async def _api_key(ctx: Context, headers: Mapping[str, str], project: str, name: str) -> bool:
    """Whether the request carries a live API key made for this inference service."""
    key = _credential(headers, {})
    if key is None or not key.startswith("gpk_") or not plausible_token(key):
        return False

    def check() -> bool:
        with ctx.sessions() as s:
            return tokens.apikey_opens(s, key, project, name)

    return await run_in_threadpool(check)


def _forward_headers(headers: Mapping[str, str], drop: frozenset[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in headers.items():
        k = key.lower()
        if k in _HOP or k in drop:
            continue
        if k == "authorization" and value.split(" ", 1)[-1].startswith(OURS):
            continue
        if k == "cookie":
            kept = [c for c in value.split(";") if c.strip().split("=", 1)[0] not in _OUR_COOKIES]
            if not kept:
                continue
            value = ";".join(kept).strip()
        out[key] = value
    return out


def _upstream_path(target: apps.AppTarget, path: str, query: str) -> str:
    # A notebook knows its base URL; a service sees the paths below its prefix, as if it were at the root.
    rest = path if target.kind == "notebook" else path[len(target.prefix) - 1 :] or "/"
    return rest + (f"?{query}" if query else "")


def _refusal(exc: ServiceError) -> Response:
    headers = {"Retry-After": "5"} if isinstance(exc, apps.NotRunning) else {}
    return JSONResponse({"detail": exc.message}, status_code=exc.status, headers=headers)


async def _target(ctx: Context, who: Principal | None, project: str, name: str) -> tuple[apps.AppTarget, AppEndpoint]:
    def find() -> apps.AppTarget:
        with ctx.sessions() as s:
            return apps.resolve(s, who, project, name)

    target = await run_in_threadpool(find)
    endpoint = ctx.backend.app_endpoint(target.alloc_id, target.port)
    if endpoint is None:
        raise apps.NotRunning(f"{project}/{name} cannot be reached through this server's backend")
    return target, endpoint


_REFRESH = frozenset({"same-origin", "none"})
"""Sec-Fetch-Site values of a navigation the portal's host mints a ticket for: from its own pages, or typed."""


@router.get(apps.AUTH_PATH)
async def app_auth(request: Request, ticket: str = "", then: Annotated[str, Query(alias="next")] = "") -> Response:
    """The apps host's sign-in: spends a ticket the portal's host minted, sets this host's cookie for the
    ticket's app, and goes on to `next`, a path of that app."""
    ctx: Context = request.app.state.ctx
    if not apps.on_apps_host(ctx.settings, request.headers.get("host", "")):
        return JSONResponse({"detail": "not found"}, 404)

    def redeem() -> apps.AppSession:
        target = apps.safe_next(then)
        if not plausible_token(ticket):
            raise apps.BadTicket("this sign-in link has expired or was used already: open the app again")
        with ctx.sessions() as s:
            got = apps.redeem_ticket(s, ticket)
        if not target.startswith(got.prefix):
            raise apps.BadNext(f"next must be a path under {got.prefix}")
        return got

    try:
        got = await run_in_threadpool(redeem)
    except ServiceError as e:
        return JSONResponse({"detail": e.message}, e.status, headers={"Cache-Control": "no-store"})
    answer = RedirectResponse(then, status_code=303, headers={"Cache-Control": "no-store"})
    answer.set_cookie(
        apps.APP_COOKIE, got.token, path=got.prefix, max_age=int(apps.APP_SESSION_TTL_S), httponly=True,
        samesite="lax", secure=ctx.settings.apps_url is not None and ctx.settings.apps_url.startswith("https:"),
    )  # fmt: skip
    return answer


async def _to_apps_host(ctx: Context, request: Request, project: str, name: str) -> Response:
    """The portal's host, apps elsewhere: a signed-in browser gets a ticket to the apps host, anyone else a plain
    redirect there (a bearer client calls the apps host itself)."""
    path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    there = apps.apps_base_url(ctx.settings) + path
    cookie = request.cookies.get(apps.SESSION_COOKIE)
    if request.method not in ("GET", "HEAD") or _bearer(request.headers) is not None:
        return RedirectResponse(there, status_code=307)
    who = await _token_caller(ctx, cookie)
    if who is None:
        return JSONResponse({"detail": "sign in first: a session or bearer token is required"}, 401,
                            headers={"WWW-Authenticate": "Bearer"})  # fmt: skip

    def mint() -> str | None:
        with ctx.sessions() as s:
            target = apps.resolve(s, who, project, name)
            if request.headers.get("sec-fetch-site", "none") not in _REFRESH:
                return None
            return apps.mint_ticket(s, who, target)

    try:
        ticket = await run_in_threadpool(mint)
    except ServiceError as e:
        return _refusal(e)
    if ticket is None:
        return _confirm(project, name, path)
    query = urlencode({"ticket": ticket, "next": path}, quote_via=quote)
    return RedirectResponse(f"{apps.apps_base_url(ctx.settings)}{apps.AUTH_PATH}?{query}", status_code=303,
                            headers={"Cache-Control": "no-store"})  # fmt: skip


def _confirm(project: str, name: str, path: str) -> HTMLResponse:
    """Asked of a navigation another site started: the user's click, on this page (which no page may frame),
    is a navigation of the portal's own origin."""
    label = html.escape(f"{project}/{name}")
    body = (f"<!doctype html><title>Open {label}</title><p>Open the app <b>{label}</b> signed in as you?</p>"
            f'<p><a href="{html.escape(path)}">Open {label}</a></p>')  # fmt: skip
    policy = "default-src 'none'; frame-ancestors 'none'"
    return HTMLResponse(
        body, headers={"X-Frame-Options": "DENY", "Cache-Control": "no-store", "Content-Security-Policy": policy}
    )


@router.api_route("/apps/{project}/{name}", methods=_METHODS)
async def app_root(project: str, name: str) -> RedirectResponse:
    return RedirectResponse(f"/apps/{project}/{name}/", status_code=307)


@router.api_route("/apps/{project}/{name}/{rest:path}", methods=_METHODS)
async def app_http(request: Request, project: str, name: str, rest: str) -> Response:
    ctx: Context = request.app.state.ctx
    apps_host = apps.on_apps_host(ctx.settings, request.headers.get("host", ""))
    if ctx.settings.apps_url is not None and not apps_host:
        return await _to_apps_host(ctx, request, project, name)
    who = await _caller(ctx, request.headers, request.cookies, project, name)
    if who is None and not await _api_key(ctx, request.headers, project, name):
        if apps_host and request.method == "GET" and request.headers.get("sec-fetch-mode") == "navigate":
            # A browser without this host's cookie: the portal's host signs it in here, or asks it to sign in.
            return RedirectResponse(ctx.settings.public_base_url + request.url.path + (
                f"?{request.url.query}" if request.url.query else ""), status_code=303)  # fmt: skip
        return JSONResponse({"detail": "sign in first: a session or bearer token is required"}, 401,
                            headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
    try:
        target, endpoint = await _target(ctx, who, project, name)
    except ServiceError as e:
        return _refusal(e)
    headers = _forward_headers(request.headers, frozenset())
    headers["host"] = request.headers.get("host", "localhost")
    if target.app_token:
        headers["authorization"] = f"token {target.app_token}"
    client_host = request.client.host if request.client else ""
    headers.update({"x-forwarded-for": client_host, "x-forwarded-proto": request.url.scheme,
                    "x-forwarded-prefix": target.prefix.rstrip("/")})  # fmt: skip
    client: httpx.AsyncClient | None = None
    try:
        # A member's socket is reached through a descriptor of it, never by a name whose links the tenant sets:
        # the descriptor is open while the connection is made (on send).
        with appsock.pinned(endpoint.uds) if endpoint.uds else contextlib.nullcontext() as uds:
            transport = httpx.AsyncHTTPTransport(uds=uds) if uds else httpx.AsyncHTTPTransport()
            client = httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(60.0, connect=5.0))
            base = "http://app" if uds else f"http://{endpoint.host}:{endpoint.port}"
            upstream_req = client.build_request(
                request.method,
                base + _upstream_path(target, request.url.path, request.url.query),
                headers=headers,
                content=request.stream(),
            )
            upstream = await client.send(upstream_req, stream=True)
    except (httpx.HTTPError, OSError):
        if client is not None:
            await client.aclose()
        return JSONResponse({"detail": f"{project}/{name} is not answering"}, 502)
    opened = client

    async def close() -> None:
        await upstream.aclose()
        await opened.aclose()

    dropped = (_HOP - {"content-length"}) | _OURS_TO_SET
    answer = StreamingResponse(_body(upstream), status_code=upstream.status_code, background=BackgroundTask(close))
    # As raw pairs, in the app's order: a mapping would keep one of several Set-Cookie headers (JupyterLab sends two).
    answer.raw_headers = [(k.lower(), v) for k, v in upstream.headers.raw if k.lower().decode("latin-1") not in dropped]
    return answer


async def _body(upstream: httpx.Response) -> AsyncIterator[bytes]:
    with contextlib.suppress(httpx.HTTPError):
        async for chunk in upstream.aiter_raw():
            yield chunk


@router.websocket("/apps/{project}/{name}/{rest:path}")
async def app_websocket(websocket: WebSocket, project: str, name: str, rest: str) -> None:
    ctx: Context = websocket.app.state.ctx
    # A cross-site page may not open a websocket with the user's cookie (cross-site websocket hijacking).
    origin = websocket.headers.get("origin")
    host = websocket.headers.get("host", "")
    if origin is not None and origin.split("://", 1)[-1] != host:
        await websocket.close(code=1008)
        return
    if ctx.settings.apps_url is not None and not apps.on_apps_host(ctx.settings, host):
        await websocket.close(code=1008)  # apps are on the apps host only
        return
    who = await _caller(ctx, websocket.headers, websocket.cookies, project, name)
    if who is None:
        await websocket.close(code=1008)
        return
    try:
        target, endpoint = await _target(ctx, who, project, name)
    except ServiceError:
        await websocket.close(code=1008)
        return
    path = _upstream_path(target, websocket.url.path, websocket.url.query)
    headers = _forward_headers(websocket.headers, _WS_DROP)
    if target.app_token:
        headers["authorization"] = f"token {target.app_token}"
    asked = websocket.headers.get("sec-websocket-protocol", "").split(",")
    protocols = [Subprotocol(p.strip()) for p in asked if p.strip()] or None
    try:
        if endpoint.uds:
            sock = await run_in_threadpool(appsock.connect, endpoint.uds, 10.0)  # the member's, its peer checked
            upstream = await unix_connect(
                None, f"ws://{host or 'localhost'}{path}", sock=sock, additional_headers=headers,
                subprotocols=protocols, max_size=None, open_timeout=10,
            )  # fmt: skip
        else:
            upstream = await connect(
                f"ws://{endpoint.host}:{endpoint.port}{path}", additional_headers=headers,
                subprotocols=protocols, max_size=None, open_timeout=10,
            )  # fmt: skip
    except (OSError, TimeoutError, ConnectionClosed, Exception):
        await websocket.close(code=1011)
        return
    await websocket.accept(subprotocol=upstream.subprotocol)
    await _pump(ctx, (project, name), target.workload_id, websocket, upstream)


async def _pump(
    ctx: Context, app: tuple[str, str], workload_id: int, ws: WebSocket, upstream: ClientConnection
) -> None:
    async def client_to_app() -> None:
        while True:
            msg = await ws.receive()
            if msg["type"] == "websocket.disconnect":
                return
            data = msg.get("bytes")
            await upstream.send(data if data is not None else msg.get("text") or "")

    async def app_to_client() -> None:
        async for data in upstream:
            if isinstance(data, bytes):
                await ws.send_bytes(data)
            else:
                await ws.send_text(data)

    async def recheck() -> None:
        def allowed(who: Principal) -> bool:
            with ctx.sessions() as s:
                return apps.still_allowed(s, who, workload_id)

        while True:
            await asyncio.sleep(ctx.settings.app_recheck_s)
            ctx.principals.clear()  # a revoked token or a removed member is seen at once, not after the cache's ttl
            who = await _caller(ctx, ws.headers, ws.cookies, *app)
            if who is None or not await run_in_threadpool(allowed, who):
                return

    tasks = [asyncio.create_task(t()) for t in (client_to_app, app_to_client, recheck)]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        with contextlib.suppress(Exception):
            await upstream.close()
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await ws.close()
