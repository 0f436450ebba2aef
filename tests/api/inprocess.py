"""The real app, assembled as `gpupool server` assembles it, served in-process with no scheduler loop running
(nothing is launched unless a test runs a cycle itself), and a raw ASGI caller that sends bytes exactly as
given: an HTTP client would re-encode headers and add its own Content-Length."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from starlette.types import Message

from gpupool.api.app import create_app
from gpupool.api.deps import Context
from gpupool.server import build
from gpupool.settings import Settings

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: far, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: hub, user: {token: t}}]
contexts: [{name: far, context: {cluster: far, user: hub}}]
current-context: far
"""
"""A spoke's kubeconfig that is never reached (nothing listens on its port): clusters added, listed and refused."""


@dataclass
class Api:
    app: FastAPI
    ctx: Context
    admin_token: str

    def auth(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.admin_token}"}

    def close(self) -> None:
        """Kill whatever a test's cycles launched, and close the store's connections."""
        for alloc in self.ctx.backend.observe() or {}:
            self.ctx.backend.stop(alloc, force=True)
        self.ctx.controller.loop.stop()  # gives up the lease (PostgreSQL)
        engine = self.ctx.sessions.kw.get("bind")
        if engine is not None:
            engine.dispose()


def make_api(root: Path, gpus: str = "fake:4xH100-80GB", db_url: str | None = None, **settings: Any) -> Api:
    """`db_url`: the store (None: SQLite in the data dir); `settings`: any other of the server's settings."""
    options: dict[str, Any] = {"data_dir": root / "data", "gpus": gpus, "db_url": db_url, **settings}
    if "single_user" in Settings.model_fields:  # the server's own user runs workloads: no sandbox to probe
        options["single_user"] = True
    ctx, _ = build(Settings(**options))
    # Tests run cycles by hand, without the loop's thread; on PostgreSQL this server must still lead (take the
    # lease, register its nodes) for a cycle to act.
    ctx.controller.loop.lead()
    token = (root / "data" / "admin-token").read_text().strip()
    return Api(create_app(ctx), ctx, token)


@dataclass
class Raw:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    messages: list[Message] = field(default_factory=list)

    def header(self, name: str) -> str | None:
        found = [v for k, v in self.headers if k.lower() == name.lower().encode()]
        return found[0].decode("latin-1") if found else None

    def json(self) -> Any:
        return json.loads(self.body)


def call(
    app: Any,
    method: str,
    path: str,
    headers: Sequence[tuple[bytes, bytes]] = (),
    chunks: Iterable[bytes] = (),
    query: bytes = b"",
) -> Raw:
    """One request through the ASGI app: `headers` as raw bytes, the body as the given chunks (no
    Content-Length is added: pass one in `headers` to declare it)."""
    pending = [*chunks] or [b""]
    sent: list[Message] = []

    async def run() -> None:
        done = asyncio.Event()

        async def receive() -> Message:
            if pending:
                chunk = pending.pop(0)
                return {"type": "http.request", "body": chunk, "more_body": bool(pending)}
            await done.wait()  # as a server does: the client goes away once it has its answer
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                done.set()

        await app(scope, receive, send)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": query,
        "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 1234),
        "server": ("testserver", 80),
    }
    asyncio.run(run())
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return Raw(start["status"], list(start.get("headers", [])), body, sent)


@contextmanager
def on_socket(app: FastAPI) -> Iterator[str]:
    """The app served on a local port by uvicorn, in a thread, for a real browser or command line; its URL."""
    import threading

    import uvicorn

    from tests.e2e.conftest import wait_for
    from tests.kubernetes.cluster import free_port

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 30, "uvicorn to serve")
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(30)
