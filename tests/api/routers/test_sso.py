"""The single sign-on router, with no provider and with one that cannot be reached: what each route answers before
and around a provider's part. The flows themselves, against a real Dex, are tests/oidc's."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.api.inprocess import Api, make_api
from tests.api.routers.conftest import Store
from tests.api.routers.factories import client
from tests.e2e.conftest import free_port

pytestmark = pytest.mark.anyio
HANDLE = "h" * 43


@pytest.fixture(scope="module")
def sso_api(store: Store, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """A server whose provider is an address where nothing listens: every call to it is refused at once."""
    issuer = f"http://127.0.0.1:{free_port()}/dex"
    api = make_api(tmp_path_factory.mktemp("sso"), db_url=store(), oidc_issuer=issuer, oidc_client_id="gpupool",
                   oidc_roles=("ml-admins=admin",))  # fmt: skip
    yield api
    api.close()


@pytest.fixture
async def sso(sso_api: Api) -> AsyncIterator[httpx.AsyncClient]:
    async with client(sso_api) as c:
        yield c


def refusal(r: httpx.Response) -> tuple[int, str, str]:
    return r.status_code, r.headers["location"], r.headers.get("set-cookie", "")


async def test_the_config_says_whether_sign_on_is_offered(http: httpx.AsyncClient, sso: httpx.AsyncClient) -> None:
    assert [(r.status_code, r.json()) for r in (await http.get("/api/v1/sso/config"),
                                                 await sso.get("/api/v1/sso/config"))] == [
        (200, {"enabled": False}), (200, {"enabled": True}),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/api/v1/sso/login"), ("GET", "/api/v1/sso/callback"), ("POST", "/api/v1/sso/session"),
     ("POST", "/api/v1/sso/device"), ("POST", f"/api/v1/sso/device/{HANDLE}")],
)  # fmt: skip
async def test_without_a_provider_every_step_is_404(http: httpx.AsyncClient, method: str, path: str) -> None:
    r = await http.request(method, path)
    assert (r.status_code, r.json()) == (404, {"detail": "single sign-on is not configured"})


async def test_a_login_the_provider_cannot_begin_lands_on_the_sign_in_page(sso: httpx.AsyncClient) -> None:
    status, location, cookie = refusal(await sso.get("/api/v1/sso/login"))
    assert (status, location) == (303, "/#/login?sso_error=provider")
    assert cookie.startswith('gpupool_sso_login=""; ') and "Path=/api/v1/sso/" in cookie


async def test_a_callback_the_person_declined_lands_on_the_sign_in_page_and_is_audited(
    sso: httpx.AsyncClient, sso_api: Api
) -> None:
    rid = "sso-declined-0001"
    r = await sso.get("/api/v1/sso/callback", params={"error": "access_denied", "error_description": "<b>no</b>"},
                      headers={"X-Request-ID": rid})  # fmt: skip
    assert refusal(r)[:2] == (303, "/#/login?sso_error=provider_denied")
    audit = await sso.get("/api/v1/audit", params={"limit": 1000}, headers=sso_api.auth())
    assert [(a["action"], a["status"]) for a in audit.json() if a["request_id"] == rid] == [
        ("GET /api/v1/sso/callback", 403)
    ]


async def test_a_callback_without_the_login_cookie_is_refused(sso: httpx.AsyncClient) -> None:
    r = await sso.get("/api/v1/sso/callback", params={"code": "c", "state": "s"})
    assert refusal(r)[:2] == (303, "/#/login?sso_error=state")
    r = await sso.get("/api/v1/sso/callback", params={"code": "c", "state": "s"},
                      headers={"Cookie": "gpupool_sso_login=forged"})  # fmt: skip
    assert refusal(r)[:2] == (303, "/#/login?sso_error=state")


async def test_completing_a_sign_on_that_never_began_is_401(sso: httpx.AsyncClient) -> None:
    for cookie in ({}, {"Cookie": "gpupool_sso_session=forged"}):
        r = await sso.post("/api/v1/sso/session", headers=cookie)
        assert (r.status_code, r.json(), r.headers["cache-control"]) == (
            401, {"detail": "no single sign-on to complete: sign in again"}, "no-store",
        )  # fmt: skip


async def test_a_device_login_the_provider_cannot_begin_is_502(sso: httpx.AsyncClient) -> None:
    r = await sso.post("/api/v1/sso/device")
    assert (r.status_code, r.json()) == (502, {"detail": "the identity provider cannot begin a device login now"})


async def test_polling_a_device_login_that_does_not_exist(sso: httpx.AsyncClient) -> None:
    r = await sso.post(f"/api/v1/sso/device/{HANDLE}")
    assert (r.status_code, r.json(), r.headers["cache-control"]) == (
        410, {"detail": "this device login expired or does not exist; begin again"}, "no-store",
    )  # fmt: skip
    r = await sso.post(f"/api/v1/sso/device/{'h' * 65}")
    assert (r.status_code, [e["type"] for e in r.json()["detail"]]) == (422, ["string_too_long"])
