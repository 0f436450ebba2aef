"""The app proxy: /apps/<project>/<name>/ for HTTP and websockets, only for callers the server has authenticated
and who may use the app, with the caller's gpupool credentials kept from the app. These routes are outside the
OpenAPI document, so the authorisation matrix does not reach them: who may open what is tested here."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx
import pytest
from starlette.types import Message

from tests.api.inprocess import Api, on_socket
from tests.api.routers.factories import Factory, client
from tests.e2e.conftest import free_port

pytestmark = pytest.mark.anyio
SIGN_IN = {"detail": "sign in first: a session or bearer token is required"}
ECHO = """
import http.server, json, os
class Echo(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Echo).serve_forever()
"""
"""An inference service that answers every GET with the path and headers it was sent."""
COOKIES = """
import http.server, os
class App(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)  # with the standard library's own Server and Date headers
        self.send_header("Set-Cookie", "a=1; Path=/")
        self.send_header("Set-Cookie", "b=2; Path=/")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(os.environ["PORT"])), App).serve_forever()
"""
"""A service whose answer has a Server, a Date and two Set-Cookie headers."""


async def service(make: Factory, project: str, **fields: Any) -> dict[str, Any]:
    return await make.workload(project, **{"type": "inference", "port": free_port(), "command": ["serve"], **fields})


@contextlib.asynccontextmanager
async def running(api: Api, source: str) -> AsyncIterator[tuple[httpx.AsyncClient, Factory, str]]:
    """An inference service running the Python `source` in a new project of `api`, once it runs: a client of the
    app in-process, its factory, and the service's address (/apps/<project>/<name>)."""
    async with client(api) as http:
        make = Factory(api, http)
        proj = await make.project()
        app = await service(make, proj, priority="training", command=[sys.executable, "-c", source])
        await make.until_state(app, "running")
        yield http, make, f"/apps/{proj}/{app['name']}"


async def test_the_bare_address_of_an_app_gains_its_slash(http: httpx.AsyncClient) -> None:
    r = await http.get("/apps/vision/nb")
    assert (r.status_code, r.headers["location"]) == (307, "/apps/vision/nb/")


@pytest.mark.parametrize("authorization", [None, "Bearer gp_not-a-token", "Bearer not-a-gpupool-token", "Basic eDp5"])
async def test_an_unauthenticated_request_is_401(http: httpx.AsyncClient, make: Factory, authorization: str) -> None:
    proj = await make.project()
    app = await service(make, proj)
    headers = {} if authorization is None else {"Authorization": authorization}
    r = await http.get(f"/apps/{proj}/{app['name']}/", headers=headers)
    assert (r.status_code, r.json(), r.headers["www-authenticate"]) == (401, SIGN_IN, "Bearer")


async def test_who_may_open_an_app_that_does_not_run_yet(http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project()
    app, job = await service(make, proj), await make.workload(proj)
    member, viewer, outsider = await make.user(proj), await make.user(proj, role="viewer"), await make.user()
    cases = [
        (member, app["name"], 503, f"{proj}/{app['name']} is pending; it answers once it runs"),
        (viewer, app["name"], 403, f"your role (viewer) cannot open apps of {proj!r}"),
        (outsider, app["name"], 404, f"no app {proj}/{app['name']}"),
        (member, job["name"], 404, f"no app {proj}/{job['name']}"),  # a training job is no app
        (member, "nothing", 404, f"no app {proj}/nothing"),
    ]
    for who, name, status, reason in cases:
        r = await http.get(f"/apps/{proj}/{name}/lab", headers=who.auth)
        assert (r.status_code, r.json()) == (status, {"detail": reason}), (who.name, name)
    r = await http.get(f"/apps/{proj}/{app['name']}/", headers=member.auth)
    assert r.headers["retry-after"] == "5"


async def test_a_portal_session_cookie_opens_apps(http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project()
    app = await service(make, proj)
    member = await make.user(proj)
    await make.ok("PUT", f"/api/v1/users/{member.name}/password", {"password": "a long password"})
    login = await http.post("/api/v1/login", json={"name": member.name, "password": "a long password"})
    r = await http.get(f"/apps/{proj}/{app['name']}/", headers={"Cookie": f"gpupool_session={login.json()['token']}"})
    assert r.status_code == 503  # past the sign-in: the app is not running yet


async def test_an_api_key_opens_the_one_service_it_was_made_for(http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project()
    mine, other = await service(make, proj), await service(make, proj)
    key = await make.ok("POST", "/api/v1/tokens", {"name": make.name("key"), "kind": "apikey", "project": proj,
                                                   "app": mine["name"]})  # fmt: skip
    auth = {"Authorization": f"Bearer {key['token']}"}
    assert (await http.get(f"/apps/{proj}/{mine['name']}/v1/models", headers=auth)).status_code == 503
    r = await http.get(f"/apps/{proj}/{other['name']}/v1/models", headers=auth)
    assert (r.status_code, r.json()) == (401, SIGN_IN)
    assert (await http.get("/api/v1/whoami", headers=auth)).status_code == 401  # a key opens no API
    await make.ok("DELETE", f"/api/v1/tokens/{key['id']}")
    r = await http.get(f"/apps/{proj}/{mine['name']}/v1/models", headers=auth)
    assert (r.status_code, r.json()) == (401, SIGN_IN)


async def test_an_app_named_with_a_nul_byte_is_refused(http: httpx.AsyncClient, make: Factory) -> None:
    r = await http.get("/apps/a%00b/nb/", headers=make.admin.auth)
    assert (r.status_code, r.json()) == (422, {"detail": "a NUL byte is not allowed in a path or a query"})


async def websocket(api: Api, path: str, headers: list[tuple[bytes, bytes]]) -> list[tuple[str, Any]]:
    """Opens a websocket to the app in-process (httpx speaks no websocket); what the app sent back."""
    sent: list[Message] = []
    scope = {
        "type": "websocket", "asgi": {"version": "3.0"}, "http_version": "1.1", "scheme": "ws", "path": path,
        "raw_path": path.encode(), "root_path": "", "query_string": b"", "subprotocols": [],
        "headers": [(b"host", b"testserver"), *headers], "client": ("127.0.0.1", 1234), "server": ("testserver", 80),
    }  # fmt: skip
    connected = False

    async def receive() -> Message:
        nonlocal connected
        if not connected:
            connected = True
            return {"type": "websocket.connect"}
        await anyio.sleep_forever()  # the client says nothing more; a refusal ends the call before this
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)

    with anyio.fail_after(10):
        await api.app(scope, receive, send)
    return [(m["type"], m.get("code")) for m in sent]


async def test_a_websocket_is_refused_without_a_caller_from_elsewhere_or_to_an_app_not_running(
    api: Api, make: Factory
) -> None:
    proj = await make.project()
    app = await service(make, proj)
    path = f"/apps/{proj}/{app['name']}/ws"
    token = (b"authorization", f"Bearer {api.admin_token}".encode())
    refused = [("websocket.close", 1008)]
    assert await websocket(api, path, []) == refused
    assert await websocket(api, path, [token, (b"origin", b"https://evil.example")]) == refused
    assert await websocket(api, path, [token, (b"origin", b"http://testserver")]) == refused  # pending: 503 for HTTP


async def test_a_running_service_gets_the_request_without_the_callers_credentials(
    fresh_api: Callable[..., Api],
) -> None:
    async with running(fresh_api(), ECHO) as (http, make, prefix):
        headers = {**make.admin.auth, "Cookie": "gpupool_session=gps_x; theme=dark", "X-Custom": "kept"}
        r = await http.get(f"{prefix}/v1/models", params={"q": "1"}, headers=headers)
        assert r.status_code == 200
        seen = json.loads(r.content)
        forwarded = {k: v for k, v in seen["headers"].items() if k.startswith("x-") or k in ("cookie", "host")}
        assert (seen["path"], "authorization" in seen["headers"], forwarded) == ("/v1/models?q=1", False, {
            "cookie": "theme=dark", "host": "testserver", "x-custom": "kept", "x-forwarded-for": "127.0.0.1",
            "x-forwarded-proto": "http", "x-forwarded-prefix": prefix,
        })  # fmt: skip


async def test_through_a_real_server_the_answer_has_one_server_and_one_date_header_and_every_cookie(
    fresh_api: Callable[..., Api],
) -> None:
    api = fresh_api()
    async with running(api, COOKIES) as (_, make, prefix):
        # Served by uvicorn, which adds its own Server and Date to every answer, as `gpupool server` does.
        with on_socket(api.app) as url:
            async with httpx.AsyncClient() as real:
                r = await real.get(f"{url}{prefix}/", headers=make.admin.auth)
    names = [k.decode("latin-1").lower() for k, _ in r.headers.raw]
    assert (r.status_code, r.text, names.count("server"), names.count("date")) == (200, "ok", 1, 1)
    assert (r.headers["server"], r.headers.get_list("set-cookie")) == ("uvicorn", ["a=1; Path=/", "b=2; Path=/"])
