"""Apps on an origin of their own (`apps_url`): the apps host serves /apps/ and nothing else, never reads the
portal's session, and signs a browser in with a cookie of its own, handed over by a single-use ticket that the
portal's host mints for a signed-in caller who may open the app."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx
import pytest
from starlette.types import Receive, Scope, Send

from gpupool.api.apphost import AppsHostOnly
from gpupool.services import apps
from tests.api.inprocess import Api, make_api
from tests.api.routers.conftest import Store
from tests.api.routers.factories import Factory, Person
from tests.api.routers.test_apps import ECHO, SIGN_IN, service, websocket

pytestmark = pytest.mark.anyio
APPS = "http://apps.test"
ONLY_APPS = {"detail": "not found: this host serves apps only, under /apps/"}
PASSWORD = "a long password"


@pytest.fixture(scope="module")
def api(store: Store, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    api = make_api(tmp_path_factory.mktemp("apps-host"), db_url=store(), apps_url=APPS)
    yield api
    api.close()


def new_client(api: Api) -> httpx.AsyncClient:
    """A client with no cookie jar of its use: every cookie a test sends, it names."""
    transport = httpx.ASGITransport(app=AppsHostOnly(api.app, api.ctx.settings), raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://testserver", cookies=None)


@pytest.fixture
async def http(api: Api) -> AsyncIterator[httpx.AsyncClient]:
    async with new_client(api) as c:
        yield c


async def session_of(api: Api, make: Factory, who: Person) -> str:
    await make.ok("PUT", f"/api/v1/users/{who.name}/password", {"password": PASSWORD})
    async with new_client(api) as c:
        r = await c.post("/api/v1/login", json={"name": who.name, "password": PASSWORD})
    token: str = r.json()["token"]
    return token


async def get(api: Api, url: str, **headers: str) -> httpx.Response:
    async with new_client(api) as c:  # a fresh jar: only the cookies named here go
        return await c.get(url, headers=headers)


@pytest.fixture(scope="module")
def running(api: Api) -> dict[str, Any]:
    """A project with a member, an outsider, and two running echo services."""

    async def setup() -> dict[str, Any]:
        async with new_client(api) as c:
            make = Factory(api, c)
            proj = await make.project(deserved_gpus=2)
            mine = await service(make, proj, priority="training", command=[sys.executable, "-c", ECHO])
            other = await service(make, proj, priority="training", command=[sys.executable, "-c", ECHO])
            await make.until_state(mine, "running")
            await make.until_state(other, "running")
            member, outsider = await make.user(proj), await make.user()
            session, outside = await session_of(api, make, member), await session_of(api, make, outsider)
            return {"proj": proj, "app": mine["name"], "other": other["name"], "member": member,
                    "session": session, "outsider": outside}  # fmt: skip

    return anyio.run(setup)


async def ticket_for(api: Api, session: str, path: str) -> str:
    r = await get(api, path, cookie=f"gpupool_session={session}")
    assert r.status_code == 303, r.text
    where = urlsplit(r.headers["location"])
    assert (where.scheme, where.netloc, where.path) == ("http", "apps.test", "/apps/_auth")
    query = parse_qs(where.query)
    assert query["next"] == [path]
    return query["ticket"][0]


async def test_the_apps_host_serves_apps_only(api: Api, make: Factory) -> None:
    for path in ("/", "/api/v1/whoami", "/portal/app.js", "/healthz", "/docs"):
        r = await get(api, APPS + path, authorization=f"Bearer {api.admin_token}")
        assert (r.status_code, r.json()) == (404, ONLY_APPS), path
    async with new_client(api) as c:
        r = await c.post(APPS + "/api/v1/login", json={"name": "admin", "password": PASSWORD})
    assert (r.status_code, r.json(), "set-cookie" in r.headers) == (404, ONLY_APPS, False)
    # The API refuses the apps host by itself too, where no gate stands in front of it.
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api.app), base_url=APPS) as bare:
        r = await bare.get("/api/v1/whoami", headers={"Authorization": f"Bearer {api.admin_token}"})
    assert (r.status_code, r.json()) == (404, ONLY_APPS)
    assert (await get(api, "/api/v1/whoami", authorization=f"Bearer {api.admin_token}")).status_code == 200
    token = (b"authorization", f"Bearer {api.admin_token}".encode())
    assert await websocket(on_apps_host(api), "/api/v1/workloads/x/attach", [token]) == [("websocket.close", 1008)]


def on_apps_host(api: Api) -> Api:
    """The gated app, as called with the apps host's name (`websocket` says testserver)."""
    gated = AppsHostOnly(api.app, api.ctx.settings)

    async def renamed(scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(k, b"apps.test" if k == b"host" else v) for k, v in scope["headers"]]
        await gated({**scope, "headers": headers}, receive, send)

    return Api(renamed, api.ctx, api.admin_token)  # type: ignore[arg-type]


async def test_the_portals_host_hands_a_signed_in_browser_over_with_a_ticket(api: Api, running: dict[str, Any]) -> None:
    proj, app, session = running["proj"], running["app"], running["session"]
    path = f"/apps/{proj}/{app}/v1/models?q=1"
    # No credential: sign in first. A bearer client is sent to the apps host as it came.
    assert (await get(api, path)).json() == SIGN_IN
    r = await get(api, path, authorization=f"Bearer {api.admin_token}")
    assert (r.status_code, r.headers["location"]) == (307, APPS + path)
    # Another site's navigation (an app's page, say) gets a page to click, no ticket; no one may frame it.
    r = await get(api, path, cookie=f"gpupool_session={session}", **{"sec-fetch-site": "same-site"})
    assert (r.status_code, "ticket" in r.text, r.headers["x-frame-options"]) == (200, False, "DENY")
    assert f'href="/apps/{proj}/{app}/v1/models?q=1"' in r.text
    # Another project's user learns nothing of the app, and gets no ticket.
    r = await get(api, path, cookie=f"gpupool_session={running['outsider']}")
    assert (r.status_code, r.json()) == (404, {"detail": f"no app {proj}/{app}"})

    ticket = await ticket_for(api, session, path)
    auth = f"{APPS}/apps/_auth?ticket={ticket}&next=/apps/{proj}/{app}/v1/models%3Fq%3D1"
    assert (await get(api, auth.replace(APPS, ""))).status_code == 404  # spent on the apps host only
    r = await get(api, auth)
    assert (r.status_code, r.headers["location"]) == (303, path)
    cookie = r.headers["set-cookie"]
    value = cookie.split(";")[0].split("=", 1)[1]
    attributes = sorted(a.strip().lower() for a in cookie.split(";")[1:] if not a.strip().lower().startswith("max-age"))
    assert attributes == ["httponly", f"path=/apps/{proj}/{app}/", "samesite=lax"]  # no Domain: this host alone
    again = await get(api, auth)
    assert (again.status_code, again.json()["detail"]) == (
        403, "this sign-in link has expired or was used already: open the app again from the portal"
    )  # fmt: skip

    r = await get(api, APPS + path, cookie=f"{apps.APP_COOKIE}={value}; theme=dark")
    assert r.status_code == 200
    seen = json.loads(r.content)
    assert (seen["path"], seen["headers"]["cookie"], seen["headers"]["host"]) == ("/v1/models?q=1", "theme=dark",
                                                                                "apps.test")  # fmt: skip
    # The cookie opens the app it was made for, nothing else: not the project's other app, not the API.
    r = await get(api, f"{APPS}/apps/{proj}/{running['other']}/", cookie=f"{apps.APP_COOKIE}={value}")
    assert (r.status_code, r.json()) == (401, SIGN_IN)
    r = await get(api, APPS + "/api/v1/whoami", cookie=f"{apps.APP_COOKIE}={value}")
    assert (r.status_code, r.json()) == (404, ONLY_APPS)
    # The portal's session is no credential on the apps host; a browser without one goes to sign in there.
    assert (await get(api, APPS + path, cookie=f"gpupool_session={session}")).json() == SIGN_IN
    r = await get(api, APPS + path, cookie=f"gpupool_session={session}", **{"sec-fetch-mode": "navigate"})
    assert (r.status_code, r.headers["location"]) == (303, api.ctx.settings.public_base_url + path)


async def test_a_ticket_goes_only_under_its_app_and_lives_30_seconds(api: Api, running: dict[str, Any]) -> None:
    proj, app, session = running["proj"], running["app"], running["session"]
    base = f"/apps/{proj}/{app}/"
    for outside in ("/api/v1/whoami", "//evil.example/apps/", "https://evil.example/apps/x", "/apps/../api/v1/x"):
        ticket = await ticket_for(api, session, base)
        r = await get(api, f"{APPS}/apps/_auth?ticket={ticket}&next={outside}")
        assert (r.status_code, r.json(), "set-cookie" in r.headers) == (
            400, {"detail": "next must be a path under /apps/"}, False), outside  # fmt: skip
    ticket = await ticket_for(api, session, base)
    r = await get(api, f"{APPS}/apps/_auth?ticket={ticket}&next=/apps/{proj}/{running['other']}/")
    assert (r.status_code, r.json(), "set-cookie" in r.headers) == (
        400, {"detail": f"next must be a path under {base}"}, False)  # fmt: skip

    with api.ctx.sessions() as s:
        who = api.ctx.principals.get(s, session)
        assert who is not None
        target = apps.resolve(s, who, proj, app)
        stale = apps.mint_ticket(s, who, target, now=time.time() - apps.TICKET_TTL_S - 1)
    r = await get(api, f"{APPS}/apps/_auth?ticket={stale}&next={base}")
    assert (r.status_code, "set-cookie" in r.headers) == (403, False)


async def test_signing_out_of_the_portal_ends_the_apps_host_session(api: Api, running: dict[str, Any]) -> None:
    proj, app = running["proj"], running["app"]
    async with new_client(api) as c:
        make = Factory(api, c)
        session = await session_of(api, make, running["member"])
    ticket = await ticket_for(api, session, f"/apps/{proj}/{app}/")
    r = await get(api, f"{APPS}/apps/_auth?ticket={ticket}&next=/apps/{proj}/{app}/")
    cookie = f"{apps.APP_COOKIE}={r.headers['set-cookie'].split(';')[0].split('=', 1)[1]}"
    assert (await get(api, f"{APPS}/apps/{proj}/{app}/", cookie=cookie)).status_code == 200
    async with new_client(api) as c:
        assert (await c.post("/api/v1/logout", headers={"Authorization": f"Bearer {session}"})).status_code == 204
    assert (await get(api, f"{APPS}/apps/{proj}/{app}/", cookie=cookie)).json() == SIGN_IN


async def test_the_portals_host_opens_no_app_websocket(api: Api, running: dict[str, Any]) -> None:
    path = f"/apps/{running['proj']}/{running['app']}/ws"
    token = (b"authorization", f"Bearer {api.admin_token}".encode())
    assert await websocket(api, path, [token]) == [("websocket.close", 1008)]


async def test_describe_and_the_server_say_where_apps_are_served(api: Api) -> None:
    own, shared = api.ctx.settings, api.ctx.settings.model_copy(update={"apps_url": None})
    assert (apps.isolation(own), apps.startup_note(own)) == (
        {"app_origin": "enforced: their own, http://apps.test; an app's page cannot call the API as the user "
                       "viewing it"},
        "gpupool: apps (notebooks, inference services) on their own origin, http://apps.test",
    )  # fmt: skip
    assert (apps.isolation(shared), apps.startup_note(shared)) == (
        {"app_origin": "advisory: the portal's; a tenant's app viewed by another user can act as that user "
                       "(set apps_url)"},
        "gpupool: apps share the portal's origin: a tenant's app viewed by another user can act as that user; "
        "set apps_url (docs/portal.md) unless every tenant is trusted",
    )  # fmt: skip
    assert (apps.apps_base_url(own), apps.apps_base_url(shared)) == ("http://apps.test", "http://127.0.0.1:8470")
