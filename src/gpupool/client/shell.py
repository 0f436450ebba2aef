"""The client side of the shell endpoints (gpupool.api.routers.shell holds the wire protocol): exec and attach
wired to this process's stdin, stdout and stderr (the terminal in raw mode when a TTY is asked), and
port-forward's local listener, one websocket per accepted connection."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import ssl
import sys
import threading
from collections.abc import Callable
from typing import BinaryIO
from urllib.parse import quote, urlencode

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from gpupool.client.client import ApiError

STDIN, STDOUT, STDERR, RESIZE, EXIT = 0, 1, 2, 3, 4
CHUNK = 64 * 1024
LOST = 255
"""The exit status when the server went away before the session's end was known."""


class Shell:
    def __init__(self, url: str, token: str) -> None:
        self.url = url.rstrip("/")
        self.token = token

    async def open(self, ref: str, kind: str, params: list[tuple[str, str]]) -> ClientConnection:
        """A session's websocket; a refusal is raised as ApiError with the server's reason."""
        base = "wss" + self.url[5:] if self.url.startswith("https") else "ws" + self.url[4:]
        url = f"{base}/api/v1/workloads/{quote(ref, safe='')}/{kind}?{urlencode(params)}"
        context = ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE")) if base.startswith("wss") else None
        try:
            return await connect(
                url, additional_headers={"Authorization": f"Bearer {self.token}"}, max_size=None, ssl=context,
                open_timeout=30, ping_interval=20,
            )  # fmt: skip
        except InvalidStatus as e:
            raise ApiError(e.response.status_code, _detail(e.response.body)) from None
        except (OSError, TimeoutError) as e:
            raise ApiError(0, f"cannot reach gpupool at {self.url}: {e}") from None


def params(project: str | None, rank: int, **more: str | list[str]) -> list[tuple[str, str]]:
    out = [("rank", str(rank))] + ([("project", project)] if project else [])
    for key, value in more.items():
        out += [(key, v) for v in value] if isinstance(value, list) else [(key, value)]
    return out


async def interact(ws: ClientConnection, tty: bool, send_eof: bool = True) -> int:
    """Pump this process's stdin to the session and its output to stdout/stderr until the session ends: its
    exit status. With `tty`, the terminal is raw meanwhile and its size follows the window's."""
    loop = asyncio.get_running_loop()
    fd = sys.stdin.fileno()
    restore: Callable[[], None] = lambda: None  # noqa: E731
    if tty:
        restore = _raw(fd)
        await ws.send(bytes([RESIZE]) + _size(fd))
        loop.add_signal_handler(signal.SIGWINCH, lambda: asyncio.ensure_future(_send(ws, bytes([RESIZE]) + _size(fd))))
    threading.Thread(target=_read_stdin, args=(loop, ws, fd, send_eof), daemon=True, name="gpupool-stdin").start()
    out, err = sys.stdout.buffer, sys.stderr.buffer
    try:
        async for frame in ws:
            if not isinstance(frame, bytes) or not frame:
                continue
            channel, payload = frame[0], frame[1:]
            if channel in (STDOUT, STDERR):
                _write(out if channel == STDOUT else err, payload)
            elif channel == EXIT:
                return int(payload) if payload.isdigit() else 1
    except ConnectionClosed:
        pass
    finally:
        if tty:
            loop.remove_signal_handler(signal.SIGWINCH)
        restore()
    print("error: the connection to the server was lost", file=sys.stderr)
    return LOST


def _read_stdin(loop: asyncio.AbstractEventLoop, ws: ClientConnection, fd: int, send_eof: bool) -> None:
    """On a thread of its own: stdin may be a file, which no event loop can poll."""
    while True:
        try:
            data = os.read(fd, CHUNK)
        except OSError:
            data = b""
        if not data and not send_eof:
            return
        done = asyncio.run_coroutine_threadsafe(_send(ws, bytes([STDIN]) + data), loop)
        with contextlib.suppress(Exception):
            done.result()
        if not data:
            return


async def _send(ws: ClientConnection, frame: bytes) -> None:
    with contextlib.suppress(ConnectionClosed):
        await ws.send(frame)


def _write(stream: BinaryIO, data: bytes) -> None:
    stream.write(data)
    stream.flush()


def _raw(fd: int) -> Callable[[], None]:
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    tty.setraw(fd)
    return lambda: termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _size(fd: int) -> bytes:
    size = os.get_terminal_size(fd)
    return json.dumps({"cols": size.columns, "rows": size.lines}).encode()


def _detail(body: bytes | bytearray | None) -> str:
    try:
        return str(json.loads(body or b"")["detail"])
    except (ValueError, KeyError, TypeError):
        return (body or b"").decode(errors="replace")[:200] or "refused"


# -- port-forward ------------------------------------------------------------------------------------------
async def forward(
    shell: Shell, ref: str, query: list[tuple[str, str]], local: int, ready: Callable[[int], None]
) -> None:
    """Listen on 127.0.0.1:`local` (0: any free port) and relay each connection through its own session; runs
    until cancelled. `ready` is told the port listened on."""

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            ws = await shell.open(ref, "port-forward", query)
        except ApiError as e:
            print(f"error: {e.reason}", file=sys.stderr, flush=True)
            writer.close()
            return
        await _relay(ws, reader, writer)

    server = await asyncio.start_server(relay, "127.0.0.1", local)
    async with server:
        ready(int(server.sockets[0].getsockname()[1]))
        await server.serve_forever()


async def _relay(ws: ClientConnection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    async def up() -> None:
        while data := await reader.read(CHUNK):
            await ws.send(bytes([STDIN]) + data)
        await ws.send(bytes([STDIN]))  # half-close: the far end sees the end of what was sent
        await asyncio.Future()  # keep reading the answer

    async def down() -> None:
        async for frame in ws:
            if not isinstance(frame, bytes) or not frame:
                continue
            if frame[0] == STDOUT:
                writer.write(frame[1:])
                await writer.drain()
            elif frame[0] == STDERR:
                print(f"port-forward: {frame[1:].decode(errors='replace').strip()}", file=sys.stderr, flush=True)
            elif frame[0] == EXIT:
                return

    tasks = [asyncio.create_task(up()), asyncio.create_task(down())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    except (ConnectionClosed, OSError):
        pass
    finally:
        for t in tasks:
            t.cancel()
        with contextlib.suppress(Exception):
            await ws.close()
        writer.close()
