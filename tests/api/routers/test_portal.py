"""The portal router: signing in and out with a password, setting passwords, and the read models the portal draws
(shares from the last cycle, usage over time). How guessing is limited and how a password change ends other
sessions is tests/api/test_access.py's."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from tests.api.inprocess import Api
from tests.api.routers.factories import Factory, Person, client

pytestmark = pytest.mark.anyio
PASSWORD = "a long enough password"


async def with_password(make: Factory) -> Person:
    person = await make.user()
    await make.ok("PUT", f"/api/v1/users/{person.name}/password", {"password": PASSWORD})
    return person


async def test_signing_in_opens_a_session_and_a_cookie_for_the_apps(http: httpx.AsyncClient, make: Factory) -> None:
    person = await with_password(make)
    r = await http.post("/api/v1/login", json={"name": person.name, "password": PASSWORD})
    out = r.json()
    assert (r.status_code, r.headers["cache-control"], out["name"], out["role"], out["token"][:4]) == (
        200, "no-store", person.name, "member", "gps_",
    )  # fmt: skip
    assert out["expires_at"] == pytest.approx(time.time() + 12 * 3600, abs=60)
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"gpupool_session={out['token']}; ")
    attributes = {a.strip().split("=")[0].lower() for a in cookie.split(";")[1:]}
    assert attributes == {"httponly", "max-age", "path", "samesite"}  # no Secure over plain HTTP
    assert "Path=/apps/" in cookie and "SameSite=lax" in cookie
    session = {"Authorization": f"Bearer {out['token']}"}
    assert (await http.get("/api/v1/whoami", headers=session)).json()["name"] == person.name


@pytest.mark.parametrize("who", ["wrong password", "no such user", "a service account"])
async def test_a_refused_sign_in_says_the_same_whoever_it_names(
    http: httpx.AsyncClient, make: Factory, who: str
) -> None:
    person = await with_password(make)
    name = {"wrong password": person.name, "no such user": make.name("nobody")}.get(who)
    if name is None:
        proj = await make.project()
        name = (await make.ok("POST", "/api/v1/tokens", {"name": "ci", "kind": "service", "project": proj}))["user"]
    r = await http.post("/api/v1/login", json={"name": name, "password": "not the password"})
    assert (r.status_code, r.json()) == (401, {"detail": "wrong name or password"})


async def test_signing_out_ends_the_session_and_clears_the_cookie(http: httpx.AsyncClient, make: Factory) -> None:
    person = await with_password(make)
    token = (await http.post("/api/v1/login", json={"name": person.name, "password": PASSWORD})).json()["token"]
    session = {"Authorization": f"Bearer {token}"}
    r = await http.post("/api/v1/logout", headers=session)
    assert (r.status_code, r.content) == (204, b"")
    assert r.headers["set-cookie"].startswith('gpupool_session=""; ')
    assert "Max-Age=0" in r.headers["set-cookie"] and "Path=/apps/" in r.headers["set-cookie"]
    assert (await http.get("/api/v1/whoami", headers=session)).status_code == 401
    assert (await http.get("/api/v1/whoami", headers=person.auth)).status_code == 200  # its token lives on


@pytest.mark.parametrize(
    ("body", "loc", "kind"),
    [
        ({"name": "n" * 64, "password": "x"}, ["body", "name"], "string_too_long"),
        ({"name": "n"}, ["body", "password"], "missing"),
        ({"name": "n", "password": "x", "otp": "1"}, ["body", "otp"], "extra_forbidden"),
    ],
)
async def test_a_sign_in_that_breaks_the_schema_is_422(
    http: httpx.AsyncClient, body: dict[str, str], loc: list[str], kind: str
) -> None:
    r = await http.post("/api/v1/login", json=body)
    assert (r.status_code, [(e["loc"], e["type"]) for e in r.json()["detail"]]) == (422, [(loc, kind)])


async def test_a_password_is_set_for_people_only_and_has_eight_characters(
    http: httpx.AsyncClient, make: Factory
) -> None:
    person = await make.user()
    r = await http.put(f"/api/v1/users/{person.name}/password", json={"password": "short"}, headers=make.admin.auth)
    assert (r.status_code, [(e["loc"], e["type"]) for e in r.json()["detail"]]) == (
        422, [(["body", "password"], "string_too_short")],
    )  # fmt: skip
    r = await http.put("/api/v1/users/nobody/password", json={"password": PASSWORD}, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (404, {"detail": "no user named 'nobody'"})
    proj = await make.project()
    account = (await make.ok("POST", "/api/v1/tokens", {"name": "ci", "kind": "service", "project": proj}))["user"]
    r = await http.put(f"/api/v1/users/{account}/password", json={"password": PASSWORD}, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (404, {"detail": f"no user named {account!r}"})
    r = await http.put(f"/api/v1/users/{person.name}/password", json={"password": PASSWORD}, headers=person.auth)
    assert r.status_code == 204  # one's first password needs no current one


async def test_a_nul_byte_in_a_name_is_refused_at_sign_in_and_in_a_path(http: httpx.AsyncClient, make: Factory) -> None:
    r = await http.post("/api/v1/login", json={"name": "a\x00b", "password": PASSWORD})
    issues = [(e["loc"], e["type"]) for e in r.json()["detail"]]
    assert (r.status_code, issues) == (422, [(["body", "name"], "string_pattern_mismatch")])
    r = await http.put("/api/v1/users/a%00b/password", json={"password": PASSWORD}, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (422, {"detail": "a NUL byte is not allowed in a path or a query"})


async def test_shares_are_empty_before_the_first_cycle(http: httpx.AsyncClient, make: Factory) -> None:
    await make.project()
    r = await http.get("/api/v1/shares", headers=make.admin.auth)
    assert (r.status_code, r.json()) == (200, [])


async def test_shares_list_departments_then_projects_from_the_last_cycle(fresh_api: Callable[..., Api]) -> None:
    api = fresh_api()
    async with client(api) as http:
        make = Factory(api, http)
        dept = await make.department(deserved_gpus=2)
        proj = await make.project(dept, deserved_gpus=1, limit_gpus=2)
        api.ctx.controller.cycle()
        r = await http.get("/api/v1/shares", headers=make.admin.auth)
        line = {"pool": "default", "fair_share": 0.0, "allocated": 0.0, "demand": 0.0, "pending": 0}
        assert (r.status_code, r.json()) == (200, [
            {"queue": dept, "kind": "department", "parent": None, "deserved": 2.0, "limit": None, **line},
            {"queue": proj, "kind": "project", "parent": dept, "deserved": 1.0, "limit": 2.0, **line},
        ])  # fmt: skip


async def test_a_timeline_without_usage_is_empty(http: httpx.AsyncClient, make: Factory) -> None:
    r = await http.get("/api/v1/reports/timeline", headers=make.admin.auth)
    assert (r.status_code, r.json()) == (200, [])


@pytest.mark.parametrize(
    "period",
    [{"start": 100, "end": 100}, {"start": 200, "end": 100}, {"start": 0, "end": 31 * 86400 + 1}, {"start": 4e9}],
)
async def test_a_timeline_spans_a_positive_period_of_at_most_31_days(
    http: httpx.AsyncClient, make: Factory, period: dict[str, float]
) -> None:
    r = await http.get("/api/v1/reports/timeline", params=period, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (422, {"detail": "the period must be positive and at most 31 days"})
