"""The apps host serves apps and nothing else: with `apps_url` set, a request whose Host is the apps host gets a
404 anywhere outside /apps/ (the API, the portal, the docs), so that an app's page, on that origin, finds
nothing of gpupool's own to call there."""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from gpupool.services import apps
from gpupool.settings import Settings


class AppsHostOnly:
    """A plain ASGI wrapper, outermost, so no route, static file or middleware of the API answers the apps host."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"].startswith("/apps/"):
            await self.app(scope, receive, send)
            return
        host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
        if not apps.on_apps_host(self.settings, host):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        answer = JSONResponse({"detail": "not found: this host serves apps only, under /apps/"}, 404)
        await answer(scope, receive, send)
