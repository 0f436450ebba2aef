"""How the API refuses at its edge: bodies over a cap (413), bodies that are not JSON (400), field errors (422)
rendered without echoing what was sent, and the error body every refusal shares, declared for the OpenAPI.

Every refusal is `{"detail": ...}`: a sentence from a use case or from this module, or, for field errors, a
list of `{loc, msg, type}` as pydantic words them.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY = 1024 * 1024
"""The largest request body the API reads, in bytes (a workload's command and environment fit well within)."""
UNCAPPED_PREFIXES = ("/apps/",)
"""Paths whose bodies are not capped here: the app proxy streams uploads to the app and caps on its own terms."""


class FieldIssue(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class Problem(BaseModel):
    """The body of every 4xx: a reason, or the fields that are wrong and why."""

    detail: str | list[FieldIssue]


def _problem(description: str) -> dict[str, Any]:
    return {"model": Problem, "description": description}


ERRORS: dict[int | str, dict[str, Any]] = {
    400: _problem("The body is not JSON, or not UTF-8."),
    401: _problem("No valid bearer token (the response says `WWW-Authenticate: Bearer`)."),
    403: _problem("The caller's role may not do this."),
    404: _problem("No such object among those the caller may see."),
    409: _problem("It conflicts with the current state (a duplicate name, an ended workload)."),
    413: _problem(f"The body is over {MAX_BODY // (1024 * 1024)} MiB."),
    422: _problem("Invalid input: a reason, or the fields that are wrong."),
}
"""The refusals every router declares, so that clients (and schema checks) know their shape."""


async def validation_error(_request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's own handler echoes each bad input back, and fails with a 500 when that input is NaN or
    Infinity (JSON has no such numbers). This one says where and why, never what was sent; a body that is not
    JSON at all is a 400."""
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    broken = next((e for e in errors if e.get("type") == "json_invalid"), None)
    if broken is not None:
        why = str((broken.get("ctx") or {}).get("error", "malformed"))[:200]
        return JSONResponse({"detail": f"the body is not valid JSON: {why}"}, status_code=400)
    issues = [
        {
            "loc": [x if isinstance(x, int) else str(x)[:200] for x in e.get("loc", ())],
            "msg": str(e.get("msg", ""))[:500],
            "type": str(e.get("type", "invalid")),
        }
        for e in errors
    ]
    return JSONResponse({"detail": issues}, status_code=422)


class _TooLarge(Exception):
    pass


class BodyLimit:
    """Refuses a request body over `limit` bytes with 413, before anything parses it: at once when
    Content-Length says so, and by counting the chunks of a body that has none. A plain ASGI wrapper, like
    SecurityHeaders."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY, skip: tuple[str, ...] = UNCAPPED_PREFIXES) -> None:
        self.app = app
        self.limit = limit
        self.skip = skip

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or str(scope.get("path", "")).startswith(self.skip):
            await self.app(scope, receive, send)
            return
        declared = [v for k, v in scope.get("headers", ()) if k.lower() == b"content-length"]
        if declared:
            text = declared[0].strip()
            if len(declared) > 1 or not (text.isascii() and text.isdigit()):
                await _refuse(send, 400, "Content-Length is not one number")
                return
            if len(text) > 19 or int(text) > self.limit:
                await _refuse(send, 413, self._reason())
                return
        received = 0
        too_large = False
        started = False

        async def counting_receive() -> Message:
            nonlocal received, too_large
            if too_large:
                raise _TooLarge
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    too_large = True
                    raise _TooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if too_large and not started:
                # The app turned the failed read into a response of its own (FastAPI: a 400); say why instead.
                if message["type"] == "http.response.start":
                    started = True
                    await _refuse(send, 413, self._reason())
                return
            if too_large:
                return  # what is left of the app's own answer to a body it could not read
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except _TooLarge:
            if not started:
                await _refuse(send, 413, self._reason())

    def _reason(self) -> str:
        return f"the request body is over {self.limit} bytes"


class NoNul:
    """Refuses a NUL byte in the path or the query with 422 before anything reads them: no name holds one, and
    PostgreSQL refuses it in text, so a lookup by it would be a 500 there and "not found" on SQLite. Bodies are
    checked by the wire models (Wire)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            query = bytes(scope.get("query_string", b"")).lower()
            if "\x00" in scope.get("path", "") or b"%00" in query or b"\x00" in query:
                if scope["type"] == "http":
                    await _refuse(send, 422, NUL_REFUSED)
                else:
                    await send({"type": "websocket.close", "code": 1008})
                return
        await self.app(scope, receive, send)


NUL_REFUSED = "a NUL byte is not allowed in a path or a query"


async def _refuse(send: Send, status: int, reason: str) -> None:
    body = json.dumps({"detail": reason}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
