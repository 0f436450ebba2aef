"""An audit record for every mutating request, whatever its outcome (401, 403, 413 and 422 included), written
once the response is out. App traffic under /apps/ is the tenant's own and is not recorded."""

from __future__ import annotations

import logging
import re
import uuid

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpupool.api.outage import store_fault
from gpupool.services import audit

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_REQUEST_ID = re.compile(r"[A-Za-z0-9-]{8,36}")
log = logging.getLogger("gpupool.audit")


class AuditTrail:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in MUTATING or scope["path"].startswith("/apps/"):
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        request_id = given if _REQUEST_ID.fullmatch(given) else str(uuid.uuid4())
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        note = audit.begin()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            template = _template(scope)
            client = scope.get("client")
            entry = audit.Entry(
                request_id, f"{scope['method']} {template}", scope["path"], status,
                client[0] if client else None, state.get("principal"), note,
            )  # fmt: skip
            await run_in_threadpool(_write, scope, entry)


def _template(scope: Scope) -> str:
    """The route's path with its parameters named, e.g. /api/v1/workloads/{ref}/cancel. A router included with
    a prefix knows its own part only; the prefix is what precedes it in the request's path."""
    path: str = scope["path"]
    inner = str(getattr(scope.get("route"), "path", "") or "")
    if not inner:
        return path
    filled = inner
    for key, value in (scope.get("path_params") or {}).items():
        filled = filled.replace("{" + key + "}", str(value)).replace("{" + key + ":path}", str(value))
    return path[: len(path) - len(filled)] + inner if path.endswith(filled) else inner


def _write(scope: Scope, entry: audit.Entry) -> None:
    ctx = scope["app"].state.ctx
    try:
        with ctx.sessions() as session:
            audit.record(session, entry)
    except Exception as e:  # the request has been answered; losing its record must not hide that it happened
        if store_fault(e):  # the store watch logs the outage once; a traceback per request would bury it
            log.warning("could not write the audit record of request %s (%s): no store to write it to",
                        entry.request_id, entry.action)  # fmt: skip
            return
        log.exception("could not write the audit record of request %s (%s)", entry.request_id, entry.action)
