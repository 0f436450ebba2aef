"""The portal router: signing in and out with a password, setting passwords, and the read models the portal draws
(shares from the last cycle, usage over time). How guessing is limited and how a password change ends other
sessions is tests/api/test_access.py's."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gpupool.store.tables import UsageRow
from tests.api.inprocess import Api
from tests.api.routers.factories import Factory, Person, client

pytestmark = pytest.mark.anyio
PASSWORD = "a long enough password"


async def with_password(make: Factory, *projects: str) -> Person:
    person = await make.user(*projects)
    await make.ok("PUT", f"/api/v1/users/{person.name}/password", {"password": PASSWORD})
    return person


async def test_signing_in_opens_a_session_and_its_cookies(http: httpx.AsyncClient, make: Factory) -> None:
    person = await with_password(make)
    r = await http.post("/api/v1/login", json={"name": person.name, "password": PASSWORD})
    out = r.json()
    assert (r.status_code, r.headers["cache-control"], out["name"], out["role"], out["token"][:4]) == (
        200, "no-store", person.name, "member", "gps_",
    )  # fmt: skip
    assert out["expires_at"] == pytest.approx(time.time() + 12 * 3600, abs=60)
    session_cookie, csrf_cookie = r.headers.get_list("set-cookie")
    assert session_cookie.startswith(f"gpupool_session={out['token']}; ")
    attributes = {a.strip().split("=")[0].lower() for a in session_cookie.split(";")[1:]}
    assert attributes == {"httponly", "max-age", "path", "samesite"}  # no Secure over plain HTTP
    assert "Path=/;" in session_cookie and "SameSite=lax" in session_cookie
    assert (
        csrf_cookie.startswith(f"gpupool_csrf={r.cookies['gpupool_csrf']}; ") and len(r.cookies["gpupool_csrf"]) == 40
    )
    attributes = {a.strip().split("=")[0].lower() for a in csrf_cookie.split(";")[1:]}
    assert attributes == {"max-age", "path", "samesite"}  # the portal's script reads it
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
    cleared = [
        (c.split("=")[0], "Max-Age=0" in c, c.split("Path=")[1].split(";")[0]) for c in r.headers.get_list("set-cookie")
    ]
    assert cleared == [("gpupool_session", True, "/"), ("gpupool_session", True, "/apps/"), ("gpupool_csrf", True, "/")]
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


async def sign_in(browser: httpx.AsyncClient, make: Factory, *projects: str) -> tuple[str, Person]:
    """Sign `browser` in with a password: it holds the cookies a sign-in sets, as a browser does, and no token."""
    person = await with_password(make, *projects)
    r = await browser.post("/api/v1/login", json={"name": person.name, "password": PASSWORD})
    assert r.status_code == 200
    return r.cookies["gpupool_csrf"], person


async def test_the_session_cookie_signs_in_and_a_change_needs_the_csrf_header(api: Api, make: Factory) -> None:
    proj = await make.project()
    async with client(api) as browser:
        csrf, person = await sign_in(browser, make, proj)
        assert (await browser.get("/api/v1/whoami")).json()["name"] == person.name  # a read needs no header
        body = {"project": proj, "name": "nb", "type": "notebook", "gpu": 0.25}
        r = await browser.post("/api/v1/workloads", json=body)
        why = "a request signed in by cookie must send the gpupool_csrf cookie's value in an X-CSRF-Token header"
        assert (r.status_code, r.json()) == (403, {"detail": why})
        r = await browser.post("/api/v1/workloads", json=body, headers={"X-CSRF-Token": "0" * 40})
        assert r.status_code == 403
        r = await browser.post("/api/v1/workloads", json=body, headers={"X-CSRF-Token": csrf})
        assert (r.status_code, r.json()["name"]) == (201, "nb")


async def test_a_csrf_cookie_planted_without_the_session_does_not_pass(api: Api, make: Factory) -> None:
    async with client(api) as browser:
        csrf, _ = await sign_in(browser, make)
        browser.cookies.set("gpupool_csrf", "f" * 40, domain="testserver.local")
        r = await browser.post("/api/v1/logout", headers={"X-CSRF-Token": "f" * 40})
        assert r.status_code == 403
        browser.cookies.set("gpupool_csrf", csrf, domain="testserver.local")
        assert (await browser.post("/api/v1/logout", headers={"X-CSRF-Token": csrf})).status_code == 204
        assert browser.cookies.get("gpupool_session") is None
        assert (await browser.get("/api/v1/whoami")).status_code == 401


async def test_a_bearer_token_needs_no_csrf_header(api: Api, http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project()
    body = {"project": proj, "type": "notebook", "gpu": 0.25}
    async with client(api) as browser:  # a cookie beside a bearer token changes nothing: the token signs it in
        _, person = await sign_in(browser, make, proj)
        r = await browser.post("/api/v1/workloads", json={**body, "name": "a"}, headers=person.auth)
        assert r.status_code == 201
    assert (await http.post("/api/v1/workloads", json={**body, "name": "b"}, headers=person.auth)).status_code == 201


async def test_a_token_becomes_the_browsers_session_and_signing_out_keeps_it(api: Api, make: Factory) -> None:
    person = await make.user()
    token = person.auth["Authorization"].removeprefix("Bearer ")
    async with client(api) as browser:
        r = await browser.post("/api/v1/session", headers=person.auth)
        assert (r.status_code, r.json()["name"], browser.cookies["gpupool_session"]) == (200, person.name, token)
        csrf = browser.cookies["gpupool_csrf"]
        assert (await browser.post("/api/v1/logout", headers={"X-CSRF-Token": csrf})).status_code == 204
        assert (await browser.get("/api/v1/whoami")).status_code == 401
    async with client(api) as cli:  # an API token signed out of a browser is not revoked
        assert (await cli.get("/api/v1/whoami", headers=person.auth)).status_code == 200


async def test_a_workloads_metrics_are_its_usage_minutes(api: Api, http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project()
    job = await make.workload(proj, gpus=0)
    minute = int(time.time() // 60) - 5
    with api.ctx.sessions() as s:  # what the meter writes for a workload on half a GPU, busy 40% then 90%
        s.add_all([
            UsageRow(workload_id=job["id"], minute=minute, pool="default", milli_seconds=30_000,
                     busy_milli_seconds=12_000, gpu_memory_mib=2048),
            UsageRow(workload_id=job["id"], minute=minute + 1, pool="default", milli_seconds=30_000,
                     busy_milli_seconds=27_000, gpu_memory_mib=None),
        ])  # fmt: skip
        s.commit()
    r = await http.get(f"/api/v1/workloads/{job['name']}/metrics", params={"project": proj}, headers=make.admin.auth)
    assert (r.status_code, r.json()["points"]) == (200, [
        {"at": minute * 60.0, "gpus": 0.5, "gpu_util_pct": 40.0, "gpu_memory_mib": 2048},
        {"at": minute * 60.0 + 60, "gpus": 0.5, "gpu_util_pct": 90.0, "gpu_memory_mib": None},
    ])  # fmt: skip
    r = await http.get(f"/api/v1/workloads/{job['name']}/metrics", params={"project": proj, "start": 10, "end": 5},
                       headers=make.admin.auth)  # fmt: skip
    assert (r.status_code, r.json()) == (422, {"detail": "the period is empty: 'end' must be after 'start'"})


async def test_the_server_serves_uplot_as_npm_installed_it(http: httpx.AsyncClient) -> None:
    portal = Path(__file__).resolve().parents[3] / "src" / "gpupool" / "portal"
    pinned = json.loads((portal / "package-lock.json").read_text())["packages"]["node_modules/uplot"]["version"]
    installed = portal / "node_modules" / "uplot"
    assert json.loads((installed / "package.json").read_text())["version"] == pinned == "1.6.32"
    r = await http.get("/portal/vendor/uPlot.esm.js")
    assert (r.status_code, r.content) == (200, (installed / "dist" / "uPlot.esm.js").read_bytes())
    assert r.headers["content-type"].split(";")[0] == "text/javascript"
    assert (await http.get("/portal/vendor/uPlot.min.css")).status_code == 200
