"""Shells into running workloads, as websockets: exec a command in a member, attach to its stdin and output, and
forward a TCP connection to a port inside it (docs/shells.md).

Endpoints (under /api/v1; `rank` picks the member, 0 by default; `project` names the project where a name is
ambiguous):

    GET /workloads/{ref}/exec?command=ARG&command=ARG...&tty=true|false[&cols=C&rows=R]&rank=N&project=P
    GET /workloads/{ref}/attach?rank=N&project=P
    GET /workloads/{ref}/port-forward?port=REMOTE&rank=N&project=P

Authentication is the API's bearer token (`Authorization: Bearer gp_...`); cookies are not taken, so no web page
can open a shell with a signed-in browser's session. Rights are checked BEFORE the upgrade is accepted: a refusal
is a plain HTTP answer (401 unauthenticated, 403 a viewer, 404 a workload of another tenant's or none, 409 one
that is not running, 400 bad parameters) with a JSON `detail`. Every session, opened or refused, is written to the
audit trail: who, which workload and member, and the command or port.

Wire protocol, after the upgrade: binary frames whose first byte is a channel (as Kubernetes' channel.k8s.io),
the rest its payload. Text frames are ignored.

    0 stdin   client → server  bytes for the process's stdin; an EMPTY payload closes stdin (EOF).
                               port-forward: bytes for the TCP connection (empty: half-close).
    1 stdout  server → client  output (with a TTY, stdout and stderr both); port-forward: bytes from the port.
    2 stderr  server → client  error output; port-forward: the relay's error, if any (e.g. connection refused).
    3 resize  client → server  JSON {"cols": C, "rows": R}: the client's terminal size (with a TTY).
    4 exit    server → client  the session ended: the process's exit status as ASCII digits (128 + N for a
                               signal N), or empty where it is unknown. The server closes the websocket after it.

A client that closes the websocket ends an exec (its process is killed) or a port-forward connection; it only
detaches from an attach (the workload runs on). The caller's right is checked again every `app_recheck_s`
seconds (as for app connections): a revoked token or a member taken out of the project loses open sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from fastapi import APIRouter, WebSocket
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketDisconnect

from gpupool.api.deps import Context, plausible_token, principal_of
from gpupool.backends.shell import (
    EXIT,
    RESIZE,
    STDERR,
    STDIN,
    ShellError,
    ShellSession,
    ShellTarget,
    parse_resize,
    shells_for,
    terminal_size,
)
from gpupool.services import apps, shell
from gpupool.services.auth import Principal
from gpupool.services.errors import Invalid, ServiceError

router = APIRouter(tags=["shell"])

MAX_RANK = 1 << 16


class _Refused(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@router.websocket("/workloads/{ref}/exec")
async def exec_ws(websocket: WebSocket, ref: str) -> None:
    q = websocket.query_params
    argv = q.getlist("command")
    tty = _flag(q.get("tty"))
    size = terminal_size(q.get("cols"), q.get("rows"))
    await _serve(websocket, ref, "exec", lambda: shell.check_argv(argv),
                 lambda shells, loop, t: shells.exec(loop, t, argv, tty, size), argv=argv)  # fmt: skip


@router.websocket("/workloads/{ref}/attach")
async def attach_ws(websocket: WebSocket, ref: str) -> None:
    await _serve(websocket, ref, "attach", lambda: None, lambda shells, loop, t: shells.attach(loop, t))


@router.websocket("/workloads/{ref}/port-forward")
async def port_forward_ws(websocket: WebSocket, ref: str) -> None:
    raw = websocket.query_params.get("port", "")
    port = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 5 else 0

    def check() -> None:
        if not 0 < port < 65536:
            raise Invalid(f"port must be a TCP port (1-65535), not {raw[:16]!r}")

    await _serve(websocket, ref, "port-forward", check,
                 lambda shells, loop, t: shells.port_forward(loop, t, port), port=port)  # fmt: skip


Opener = Callable[..., ShellSession]


async def _serve(
    ws: WebSocket, ref: str, kind: str, check: Callable[[], object], open_session: Opener,
    argv: list[str] | None = None, port: int | None = None,
) -> None:  # fmt: skip
    ctx: Context = ws.app.state.ctx
    address = ws.client.host if ws.client else None
    who = await _caller(ctx, ws.headers)
    if who is None:
        await _deny(ws, 401, "sign in first: a bearer token is required")
        return
    rank_raw = ws.query_params.get("rank", "0")
    rank = int(rank_raw) if rank_raw.isascii() and rank_raw.isdigit() and len(rank_raw) <= 6 else -1
    project = ws.query_params.get("project") or None
    action = shell.describe(kind, rank, argv, port)
    target: ShellTarget | None = None
    try:
        if not 0 <= rank < MAX_RANK:
            raise Invalid(f"rank must be a member's number (0, 1, ...), not {rank_raw[:16]!r}")
        check()

        def find() -> ShellTarget:
            with ctx.sessions() as s:
                return shell.resolve(s, who, ref, project, rank)

        target = await run_in_threadpool(find)
        shells = shells_for(ctx.backend)
        if shells is None:
            raise _Refused(501, "this server's backend has no shells")
        loop = asyncio.get_running_loop()
        chosen = target
        try:
            session = await run_in_threadpool(lambda: open_session(shells, loop, chosen))
        except ShellError as e:
            raise _Refused(409, str(e)) from e
    except (ServiceError, _Refused) as e:
        status, detail = (e.status, e.message) if isinstance(e, ServiceError) else (e.status, e.detail)
        await _audit(ctx, who, ref, target, action, status, address)
        await _deny(ws, status, detail)
        return
    await _audit(ctx, who, ref, target, action, 101, address)
    try:
        await ws.accept()
    except BaseException:
        session.close()
        raise
    await _pump(ws, session, _recheck(ctx, ws, target.workload_id))


def _recheck(ctx: Context, ws: WebSocket, workload_id: int) -> Callable[[], Coroutine[Any, Any, None]]:
    """Returns when the caller may no longer open this session (signed out, token revoked, taken out of the
    project): an open shell does not outlive the right to open it by more than `app_recheck_s`."""

    async def watch() -> None:
        def allowed() -> bool:
            with ctx.sessions() as s:
                token = ws.headers.get("authorization", "").partition(" ")[2]
                who = ctx.principals.get(s, token.strip())
                return who is not None and apps.still_allowed(s, who, workload_id)

        while True:
            await asyncio.sleep(ctx.settings.app_recheck_s)
            if not await run_in_threadpool(allowed):
                return

    return watch


async def _pump(ws: WebSocket, session: ShellSession, recheck: Callable[[], Coroutine[Any, Any, None]]) -> None:
    async def inbound() -> None:
        broken = False  # the process's input is gone (it ended, or closed it): further input is dropped
        while True:
            msg = await ws.receive()
            if msg["type"] == "websocket.disconnect":
                return
            data = msg.get("bytes")
            if not data:
                continue
            channel, payload = data[0], data[1:]
            if channel == STDIN and not broken:
                try:
                    await run_in_threadpool(session.write if payload else _eof(session), payload)
                except (OSError, ShellError, ValueError):
                    broken = True
            elif channel == RESIZE and (size := parse_resize(payload)) is not None:
                with contextlib.suppress(OSError):
                    session.resize(*size)

    async def outbound() -> None:
        while True:
            channel, payload = await session.frames.get()
            await ws.send_bytes(bytes([channel]) + payload)
            if channel == EXIT:
                return

    tasks = [asyncio.create_task(inbound()), asyncio.create_task(outbound()), asyncio.create_task(recheck())]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if tasks[2] in done:
            with contextlib.suppress(RuntimeError, WebSocketDisconnect):
                await ws.send_bytes(bytes([STDERR]) + b"gpupool: you may no longer use this workload's shells\n")
                await ws.send_bytes(bytes([EXIT]))
    finally:
        for t in tasks:
            t.cancel()
        await run_in_threadpool(session.close)
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await ws.close()


def _eof(session: ShellSession) -> Callable[[bytes], None]:
    return lambda _: session.close_stdin()


async def _caller(ctx: Context, headers: Mapping[str, str]) -> Principal | None:
    """The caller of a bearer token (API tokens and CLI sessions; never an app's API key)."""
    scheme, _, value = headers.get("authorization", "").partition(" ")
    token = value.strip()
    if scheme.lower() != "bearer" or not plausible_token(token) or token.startswith("gpk_"):
        return None
    return await principal_of(ctx, token)


async def _deny(ws: WebSocket, status: int, detail: str) -> None:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    await ws.send_denial_response(JSONResponse({"detail": detail}, status_code=status, headers=headers))


async def _audit(
    ctx: Context, who: Principal, ref: str, target: ShellTarget | None, action: str, status: int, address: str | None
) -> None:
    def write() -> None:
        with ctx.sessions() as s:
            shell.record(s, who, ref[:200], target, action, status, address)

    await run_in_threadpool(write)


def _flag(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")
