"""The FastAPI application factory. Everything it serves is under /api/v1, except /healthz, /readyz and /metrics."""

from __future__ import annotations

import mimetypes
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from sqlalchemy.exc import DBAPIError, PendingRollbackError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpupool import __version__
from gpupool.api.apphost import AppsHostOnly
from gpupool.api.auditing import AuditTrail
from gpupool.api.deps import Context
from gpupool.api.errors import BodyLimit, NoNul, validation_error
from gpupool.api.outage import StoreGuard, StoreWatch, store_error
from gpupool.api.routers import (
    access,
    apps,
    clusters,
    code,
    docs,
    files,
    nodes,
    org,
    pools,
    portal,
    rightsizing,
    shell,
    sso,
    sweeps,
    system,
    volumes,
    workloads,
)
from gpupool.portal import STATIC
from gpupool.services.errors import ServiceError

_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        b"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    ),
    (b"referrer-policy", b"no-referrer"),
]
_APP_HEADERS = [h for h in _HEADERS if h[0] in (b"x-content-type-options", b"referrer-policy")]
"""An app behind the proxy (JupyterLab) sets its own framing and script policy; ours would break it."""


class SecurityHeaders:
    """Adds the headers above to every response. A plain ASGI wrapper: Starlette's BaseHTTPMiddleware costs
    about a millisecond a request, a tenth of a submit."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        extra = _APP_HEADERS if scope["path"].startswith("/apps/") else _HEADERS

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, with_headers)


def _operation_id(route: APIRoute) -> str:
    return route.name


def create_app(ctx: Context) -> FastAPI:
    watch = StoreWatch(ctx.sessions.kw["bind"])

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # Started with the server, not here: an app served in-process without a lifespan (the tests') has no
        # watch, and its requests pass unguarded.
        watch.start()
        try:
            yield
        finally:
            watch.stop()

    app = FastAPI(
        lifespan=lifespan,
        title="gpupool",
        version=__version__,
        description="A self-service internal GPU cloud.",
        generate_unique_id_function=_operation_id,
        docs_url=None,  # FastAPI's own pages load Swagger UI from a CDN with inline script: see api/docs.py
        redoc_url=None,
    )
    app.state.ctx = ctx
    app.state.store_watch = watch

    @app.exception_handler(ServiceError)
    async def _service_error(_request: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse({"detail": exc.message}, status_code=exc.status)

    app.add_exception_handler(RequestValidationError, validation_error)
    for fault in (DBAPIError, PoolTimeout, PendingRollbackError):
        app.add_exception_handler(fault, store_error)

    app.include_router(system.router)
    app.include_router(docs.router)
    app.mount("/docs-assets", StaticFiles(directory=docs.ASSETS), name="docs-assets")
    app.include_router(apps.router)
    for r in (org.router, access.router, workloads.router, nodes.router, pools.router, clusters.router, portal.router,
              sso.router, rightsizing.router, code.router, volumes.router, files.router, shell.router,
              sweeps.router):  # fmt: skip
        app.include_router(r, prefix="/api/v1")

    # The portal: static files that hold no data; every figure they show comes from the API with the
    # caller's token. A strict policy keeps injected markup from running or loading anything.
    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    # Scripts as RFC 9239 names them, whatever this host's /etc/mime.types says (Python 3.11's own table says
    # application/javascript; Debian's says text/javascript).
    mimetypes.add_type("text/javascript", ".js")
    app.mount("/portal", StaticFiles(directory=STATIC), name="portal")

    app.add_middleware(NoNul)
    app.add_middleware(BodyLimit)  # inside SecurityHeaders, so that a 413 carries the headers too
    app.add_middleware(AuditTrail)  # outside BodyLimit: a refused body is recorded too
    app.add_middleware(StoreGuard, watch=watch)  # outside AuditTrail: no record is attempted while the store is down
    app.add_middleware(SecurityHeaders)
    app.add_middleware(AppsHostOnly, settings=ctx.settings)
    return app
