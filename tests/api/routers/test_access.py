"""The access router: tokens, memberships, a project's settings and secrets, and the audit trail. Who may call what
is the authorisation matrix's; how tokens narrow what they do is tests/api/test_access.py's. This is what each
call answers and what it refuses."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.api.routers.factories import Factory, Person

pytestmark = pytest.mark.anyio
DAY = 86400.0


def shape(r: httpx.Response) -> tuple[int, list[tuple[list[Any], str]]]:
    return r.status_code, [(e["loc"], e["type"]) for e in r.json()["detail"]]


# -- tokens ---------------------------------------------------------------------------------------------------


async def test_a_personal_token_is_shown_once_and_listed_without_its_secret(
    http: httpx.AsyncClient, make: Factory
) -> None:
    proj = await make.project()
    person = await make.user(proj)
    name = make.name("tok")
    before = time.time()
    r = await http.post("/api/v1/tokens", json={"name": name, "project": proj, "role": "viewer",
                                                "expires_in_days": 7}, headers=person.auth)  # fmt: skip
    made = r.json()
    assert (r.status_code, r.headers["cache-control"], made["token"][:3]) == (201, "no-store", "gp_")
    assert before <= made["created_at"] <= time.time()
    assert made["expires_at"] == pytest.approx(made["created_at"] + 7 * DAY)
    listed = [t for t in (await http.get("/api/v1/tokens", headers=person.auth)).json() if t["name"] == name]
    assert listed == [{
        "id": made["id"], "name": name, "kind": "personal", "user": person.name, "project": proj, "role": "viewer",
        "app": None, "created_at": made["created_at"], "expires_at": made["expires_at"], "revoked_at": None,
        "last_used_at": None,
    }]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "loc", "kind"),
    [
        ({"name": "t", "expires_in_days": 0}, ["body", "expires_in_days"], "greater_than_equal"),
        ({"name": "t", "expires_in_days": 366}, ["body", "expires_in_days"], "less_than_equal"),
        ({"name": "t", "kind": "session"}, ["body", "kind"], "literal_error"),
        ({"name": "t", "role": "admin"}, ["body", "role"], "literal_error"),
        ({"name": "T"}, ["body", "name"], "value_error"),
    ],
)
async def test_a_token_request_that_breaks_the_schema_is_422(
    http: httpx.AsyncClient, make: Factory, body: dict[str, Any], loc: list[str], kind: str
) -> None:
    r = await http.post("/api/v1/tokens", json=body, headers=make.admin.auth)
    assert shape(r) == (422, [(loc, kind)])


async def test_service_tokens_and_api_keys_name_what_they_belong_to(http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project()
    training = await make.workload(proj)
    cases = [
        ({"kind": "service"}, 422, "a service token belongs to a project: name it"),
        ({"kind": "apikey", "project": proj}, 422, "an apikey opens one inference service: name it with app"),
        ({"kind": "apikey", "project": proj, "app": training["name"]}, 404,
         f"no inference service named {training['name']!r} in {proj!r}"),
        ({"kind": "apikey", "project": proj, "app": "nothing"}, 404,
         f"no inference service named 'nothing' in {proj!r}"),
        ({"kind": "service", "project": "nowhere"}, 404, "no project named 'nowhere'"),
    ]  # fmt: skip
    for fields, status, reason in cases:
        r = await http.post("/api/v1/tokens", json={"name": make.name("t"), **fields}, headers=make.admin.auth)
        assert (r.status_code, r.json()) == (status, {"detail": reason}), fields


async def test_an_api_key_opens_one_inference_service_and_has_no_role(http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project()
    service = await make.workload(proj, type="inference", priority="training", port=8000, command=["serve"])
    body = {"name": make.name("key"), "kind": "apikey", "project": proj, "app": service["name"], "role": "member"}
    r = await http.post("/api/v1/tokens", json=body, headers=make.admin.auth)
    made = r.json()
    assert (r.status_code, made["token"][:4], made["kind"], made["app"], made["role"], made["user"]) == (
        201, "gpk_", "apikey", service["name"], None, "admin",
    )  # fmt: skip


async def test_revoking_is_idempotent_and_hides_the_token_unless_asked(http: httpx.AsyncClient, make: Factory) -> None:
    person = await make.user()
    made = await make.ok("POST", "/api/v1/tokens", {"name": make.name("t")}, person)
    first = await http.delete(f"/api/v1/tokens/{made['id']}", headers=person.auth)
    assert (first.status_code, first.json()["id"]) == (200, made["id"])
    revoked_at = first.json()["revoked_at"]
    assert revoked_at is not None
    again = await http.delete(f"/api/v1/tokens/{made['id']}", headers=person.auth)
    assert (again.status_code, again.json()["revoked_at"]) == (200, revoked_at)
    live = [t["id"] for t in (await http.get("/api/v1/tokens", headers=person.auth)).json()]
    every = [
        t["id"] for t in (await http.get("/api/v1/tokens", params={"revoked": "true"}, headers=person.auth)).json()
    ]
    assert made["id"] not in live and made["id"] in every and every == sorted(every)


@pytest.mark.parametrize(("token_id", "status"), [("999999", 404), ("0", 422), ("2147483648", 422), ("x", 422)])
async def test_revoking_no_such_token(http: httpx.AsyncClient, make: Factory, token_id: str, status: int) -> None:
    r = await http.delete(f"/api/v1/tokens/{token_id}", headers=make.admin.auth)
    assert r.status_code == status
    if status == 404:
        assert r.json() == {"detail": f"no token {token_id}"}


# -- memberships ----------------------------------------------------------------------------------------------


async def test_members_are_set_listed_by_name_and_removed(http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project()
    a, b = await make.user(), await make.user()
    for person, role in ((b, "viewer"), (a, "member")):
        r = await http.put(f"/api/v1/queues/{proj}/members/{person.name}", json={"role": role},
                           headers=make.admin.auth)  # fmt: skip
        assert (r.status_code, r.json()) == (200, {"user": person.name, "queue": proj, "role": role})
    r = await http.put(f"/api/v1/queues/{proj}/members/{b.name}", json={}, headers=make.admin.auth)
    assert r.json() == {"user": b.name, "queue": proj, "role": "member"}  # the default role; set again, changed
    listed = (await http.get(f"/api/v1/queues/{proj}/members", headers=make.admin.auth)).json()
    assert listed == sorted(
        [{"user": p.name, "queue": proj, "role": "member"} for p in (a, b)], key=lambda m: m["user"]
    )
    r = await http.delete(f"/api/v1/queues/{proj}/members/{a.name}", headers=make.admin.auth)
    assert (r.status_code, r.json()) == (200, {"user": a.name, "state": "active", "stopped": [], "service_tokens": []})
    assert [m["user"] for m in (await http.get(f"/api/v1/queues/{proj}/members", headers=make.admin.auth)).json()] == [
        b.name
    ]
    r = await http.delete(f"/api/v1/queues/{proj}/members/{a.name}", headers=make.admin.auth)
    assert (r.status_code, r.json()) == (404, {"detail": f"{a.name!r} is not in {proj!r}"})


async def test_a_department_has_admins_and_a_project_members_and_viewers(
    http: httpx.AsyncClient, make: Factory
) -> None:
    dept = await make.department()
    proj = await make.project(dept)
    person = await make.user()
    for where, role in ((dept, "member"), (dept, "viewer"), (proj, "admin")):
        r = await http.put(f"/api/v1/queues/{where}/members/{person.name}", json={"role": role},
                           headers=make.admin.auth)  # fmt: skip
        assert (r.status_code, r.json()) == (
            422,
            {"detail": "a department has admins; a project has members and viewers"},
        )


async def test_membership_of_no_such_user_or_of_a_service_account_is_refused(
    http: httpx.AsyncClient, make: Factory
) -> None:
    proj = await make.project()
    r = await http.put(f"/api/v1/queues/{proj}/members/nobody", json={"role": "member"}, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (404, {"detail": "no user named 'nobody'"})
    service = await make.ok("POST", "/api/v1/tokens", {"name": "ci", "kind": "service", "project": proj})
    account = service["user"]
    r = await http.put(f"/api/v1/queues/{proj}/members/{account}", json={"role": "viewer"}, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (
        422,
        {"detail": f"{account!r} is a service account; its tokens say what it may do"},
    )
    r = await http.put("/api/v1/queues/Bad_Name/members/x", json={"role": "member"}, headers=make.admin.auth)
    assert shape(r) == (422, [(["path", "name"], "value_error")])


# -- a project's settings -------------------------------------------------------------------------------------


async def test_project_settings_change_what_they_name(http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project()
    r = await http.patch(f"/api/v1/projects/{proj}", json={"production_allowed": True}, headers=make.admin.auth)
    assert (r.status_code, r.json()["production_allowed"], r.json()["pod_security"]) == (200, True, "restricted")
    r = await http.patch(f"/api/v1/projects/{proj}", json={"pod_security": "baseline"}, headers=make.admin.auth)
    assert (r.status_code, r.json()["production_allowed"], r.json()["pod_security"]) == (200, True, "baseline")
    r = await http.patch(f"/api/v1/projects/{proj}", json={"pod_security": "privileged"}, headers=make.admin.auth)
    assert shape(r) == (422, [(["body", "pod_security"], "literal_error")])
    dept = await make.department()
    r = await http.patch(f"/api/v1/projects/{dept}", json={}, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (404, {"detail": f"no project named {dept!r}"})


# -- secrets --------------------------------------------------------------------------------------------------


async def test_secrets_are_set_listed_without_their_values_and_deleted(http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project()
    member = await make.user(proj)
    for key, who in (("B_TOKEN", make.admin), ("A_KEY", member), ("B_TOKEN", member)):
        r = await http.put(f"/api/v1/projects/{proj}/secrets/{key}", json={"value": "s3cret"}, headers=who.auth)
        assert (r.status_code, {k: v for k, v in r.json().items() if k != "updated_at"}) == (
            200, {"name": key, "project": proj, "updated_by": who.name},
        )  # fmt: skip
    r = await http.get(f"/api/v1/projects/{proj}/secrets", headers=member.auth)
    assert [(s["name"], s["updated_by"]) for s in r.json()] == [("A_KEY", member.name), ("B_TOKEN", member.name)]
    assert "s3cret" not in r.text
    r = await http.delete(f"/api/v1/projects/{proj}/secrets/A_KEY", headers=member.auth)
    assert (r.status_code, r.content) == (204, b"")
    r = await http.delete(f"/api/v1/projects/{proj}/secrets/A_KEY", headers=member.auth)
    assert (r.status_code, r.json()) == (404, {"detail": f"{proj!r} has no secret named 'A_KEY'"})


@pytest.mark.parametrize(
    ("key", "value", "status", "reason"),
    [
        ("PATH", "x", 422, "'PATH' cannot be a secret's name: it must be a usable environment variable name that "
                           "gpupool does not set itself"),
        ("CUDA_HOME", "x", 422, "'CUDA_HOME' cannot be a secret's name: it must be a usable environment variable "
                                "name that gpupool does not set itself"),
        ("1ABC", "x", 422, "'1ABC' cannot be a secret's name: it must be a usable environment variable name that "
                           "gpupool does not set itself"),
        ("OK", "a\x00b", 422, "a secret's value has no NUL byte and at most 32768 characters"),
    ],
)  # fmt: skip
async def test_a_secret_that_no_workload_could_take_is_422(
    http: httpx.AsyncClient, make: Factory, key: str, value: str, status: int, reason: str
) -> None:
    proj = await make.project()
    r = await http.put(f"/api/v1/projects/{proj}/secrets/{key}", json={"value": value}, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (status, {"detail": reason})
    assert (await http.get(f"/api/v1/projects/{proj}/secrets", headers=make.admin.auth)).json() == []


async def test_a_secret_value_and_name_are_bounded_by_the_schema(http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project()
    r = await http.put(f"/api/v1/projects/{proj}/secrets/BIG", json={"value": "x" * 32769}, headers=make.admin.auth)
    assert shape(r) == (422, [(["body", "value"], "string_too_long")])
    r = await http.put(f"/api/v1/projects/{proj}/secrets/{'K' * 129}", json={"value": "x"}, headers=make.admin.auth)
    assert shape(r) == (422, [(["path", "key"], "string_too_long")])


async def test_a_project_holds_at_most_a_hundred_secrets(http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project()
    for i in range(100):
        await make.ok("PUT", f"/api/v1/projects/{proj}/secrets/S{i}", {"value": "x"})
    r = await http.put(f"/api/v1/projects/{proj}/secrets/S100", json={"value": "x"}, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (422, {"detail": f"{proj!r} has 100 secrets already"})
    r = await http.put(f"/api/v1/projects/{proj}/secrets/S7", json={"value": "changed"}, headers=make.admin.auth)
    assert r.status_code == 200  # changing one it has is no new secret


# -- the audit trail ------------------------------------------------------------------------------------------


async def test_the_audit_trail_is_newest_first_and_filters_by_actor_time_and_count(
    http: httpx.AsyncClient, make: Factory
) -> None:
    person: Person = await make.user()
    since = time.time()
    names = [make.name("t") for _ in range(3)]
    for name in names:
        await make.ok("POST", "/api/v1/tokens", {"name": name}, person)
    r = await http.get("/api/v1/audit", params={"actor": person.name, "since": since}, headers=make.admin.auth)
    records = r.json()
    assert (r.status_code, [(a["action"], a["object"], a["status"]) for a in records]) == (
        200, [("POST /api/v1/tokens", f"token/{n}", 201) for n in reversed(names)],
    )  # fmt: skip
    assert [a["id"] for a in records] == sorted((a["id"] for a in records), reverse=True)
    r = await http.get("/api/v1/audit", params={"actor": person.name, "limit": 1}, headers=make.admin.auth)
    assert [a["object"] for a in r.json()] == [f"token/{names[-1]}"]
    r = await http.get(
        "/api/v1/audit", params={"actor": person.name, "since": time.time() + 60}, headers=make.admin.auth
    )
    assert r.json() == []


@pytest.mark.parametrize(
    ("query", "loc", "kind"),
    [
        ({"limit": 0}, ["query", "limit"], "greater_than_equal"),
        ({"limit": 1001}, ["query", "limit"], "less_than_equal"),
        ({"since": "nan"}, ["query", "since"], "finite_number"),
        ({"actor": "a" * 64}, ["query", "actor"], "string_too_long"),
    ],
)
async def test_audit_queries_out_of_bounds_are_422(
    http: httpx.AsyncClient, make: Factory, query: dict[str, Any], loc: list[str], kind: str
) -> None:
    assert shape(await http.get("/api/v1/audit", params=query, headers=make.admin.auth)) == (422, [(loc, kind)])


async def test_an_actor_with_a_nul_byte_is_refused(http: httpx.AsyncClient, make: Factory) -> None:
    r = await http.get("/api/v1/audit", params={"actor": "a\x00b"}, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (422, {"detail": "a NUL byte is not allowed in a path or a query"})
