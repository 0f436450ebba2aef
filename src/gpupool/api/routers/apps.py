"""The app proxy: a workload's notebook or inference service at /apps/<project>/<name>/, for HTTP and websockets
alike, and only for callers the server has authenticated (jupyter-server-proxy's CVE-2024-28179 let websocket
upgrades through unauthenticated; here both go through `_caller` and `apps.resolve`).

The caller's gpupool credentials (bearer token, session cookie) are stripped before the request goes on: the
app is the tenant's code and must never see them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping

import httpx
from fastapi import APIRouter, Request, WebSocket
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.websockets import WebSocketDisconnect
from websockets.asyncio.client import ClientConnection, connect, unix_connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from gpupool.api.deps import Context, plausible_token
from gpupool.backends.base import AppEndpoint
from gpupool.services import apps, tokens
from gpupool.services.auth import Principal
from gpupool.services.errors import ServiceError

router = APIRouter(include_in_schema=False)

_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding",
     "upgrade", "host", "content-length"}
)  # fmt: skip
_WS_DROP = frozenset(
    {"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions", "sec-websocket-protocol"}
)
_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


OURS = ("gp_", "gps_", "gpk_")
"""Credentials gpupool issues: never passed on to an app."""


def _credential(headers: Mapping[str, str], cookies: Mapping[str, str]) -> str | None:
    scheme, _, value = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.startswith(OURS):
        return value.strip()
    return cookies.get(apps.SESSION_COOKIE)


async def _caller(ctx: Context, headers: Mapping[str, str], cookies: Mapping[str, str]) -> Principal | None:
    token = _credential(headers, cookies)
    if token is None or not plausible_token(token) or token.startswith("gpk_"):
        return None
    who = ctx.principals.peek(token)
    if who is None:

        def look() -> Principal | None:
            with ctx.sessions() as s:
                return ctx.principals.get(s, token)

        who = await run_in_threadpool(look)
    return who


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
            kept = [c for c in value.split(";") if c.strip().split("=", 1)[0] != apps.SESSION_COOKIE]
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


@router.api_route("/apps/{project}/{name}", methods=_METHODS)
async def app_root(project: str, name: str) -> RedirectResponse:
    return RedirectResponse(f"/apps/{project}/{name}/", status_code=307)


@router.api_route("/apps/{project}/{name}/{rest:path}", methods=_METHODS)
async def app_http(request: Request, project: str, name: str, rest: str) -> Response:
    ctx: Context = request.app.state.ctx
    who = await _caller(ctx, request.headers, request.cookies)
    if who is None and not await _api_key(ctx, request.headers, project, name):
        return JSONResponse({"detail": "sign in first: a session or bearer token is required"}, 401,
                            headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
    try:
        target, endpoint = await _target(ctx, who, project, name)
    except ServiceError as e:
        return _refusal(e)
    transport = httpx.AsyncHTTPTransport(uds=endpoint.uds) if endpoint.uds else httpx.AsyncHTTPTransport()
    client = httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(60.0, connect=5.0))
    base = "http://app" if endpoint.uds else f"http://{endpoint.host}:{endpoint.port}"
    headers = _forward_headers(request.headers, frozenset())
    headers["host"] = request.headers.get("host", "localhost")
    if target.app_token:
        headers["authorization"] = f"token {target.app_token}"
    client_host = request.client.host if request.client else ""
    headers.update({"x-forwarded-for": client_host, "x-forwarded-proto": request.url.scheme,
                    "x-forwarded-prefix": target.prefix.rstrip("/")})  # fmt: skip
    upstream_req = client.build_request(
        request.method,
        base + _upstream_path(target, request.url.path, request.url.query),
        headers=headers,
        content=request.stream(),
    )
    try:
        upstream = await client.send(upstream_req, stream=True)
    except httpx.HTTPError:
        await client.aclose()
        return JSONResponse({"detail": f"{project}/{name} is not answering"}, 502)

    async def close() -> None:
        await upstream.aclose()
        await client.aclose()

    out_headers = {k: v for k, v in upstream.headers.multi_items() if k.lower() not in _HOP - {"content-length"}}
    return StreamingResponse(
        _body(upstream), status_code=upstream.status_code, headers=out_headers, background=BackgroundTask(close)
    )


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
    who = await _caller(ctx, websocket.headers, websocket.cookies)
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
            upstream = await unix_connect(
                endpoint.uds, f"ws://{host or 'localhost'}{path}", additional_headers=headers,
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
    await _pump(ctx, who, target.workload_id, websocket, upstream)


async def _pump(ctx: Context, who: Principal, workload_id: int, ws: WebSocket, upstream: ClientConnection) -> None:
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
        def allowed() -> bool:
            with ctx.sessions() as s:
                token_who = ctx.principals.get(s, _credential(ws.headers, ws.cookies) or "")
                return token_who is not None and apps.still_allowed(s, token_who, workload_id)

        while True:
            await asyncio.sleep(ctx.settings.app_recheck_s)
            if not await run_in_threadpool(allowed):
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
