"""The FastAPI application factory. Everything it serves is under /api/v1, except /healthz and /metrics."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from gpupool import __version__
from gpupool.api.deps import Context
from gpupool.api.routers import nodes, org, system, workloads
from gpupool.services.errors import ServiceError


def _operation_id(route: APIRoute) -> str:
    return route.name


def create_app(ctx: Context) -> FastAPI:
    app = FastAPI(
        title="gpupool",
        version=__version__,
        description="A self-service internal GPU cloud.",
        generate_unique_id_function=_operation_id,
    )
    app.state.ctx = ctx

    @app.exception_handler(ServiceError)
    async def _service_error(_request: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse({"detail": exc.message}, status_code=exc.status)

    app.include_router(system.router)
    for r in (org.router, workloads.router, nodes.router):
        app.include_router(r, prefix="/api/v1")
    return app
