"""The organisation router: departments, projects, their quotas and policies, and users. Who may call what is the
authorisation matrix's (tests/api/test_authz_matrix.py); this is what each call does, and what it refuses."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.routers.factories import Factory

pytestmark = pytest.mark.anyio
NUL = "a\x00b"  # PostgreSQL cannot hold it in a text value; SQLite can


def quota(deserved: float, limit: float | None = None, weight: int = 1, pool: str = "default") -> dict[str, Any]:
    return {"pool": pool, "deserved_gpus": deserved, "limit_gpus": limit, "weight": weight}


def queue(name: str, kind: str, parent: str | None, *quotas: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "name": name, "kind": kind, "parent": parent, "quotas": list(quotas), "strict_fifo": False,
        "allocated_gpus": 0.0, "production_allowed": False, "pod_security": "restricted", "host_network": False,
        "mlflow_uri": None, **fields,
    }  # fmt: skip


async def test_a_department_and_a_project_are_created_with_their_quota(http: httpx.AsyncClient, make: Factory) -> None:
    dept, proj = make.name("dept"), make.name("proj")
    body = {"name": dept, "deserved_gpus": 4, "limit_gpus": 6, "weight": 2}
    r = await http.post("/api/v1/departments", json=body, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (201, queue(dept, "department", None, quota(4, 6, 2)))
    body = {"name": proj, "department": dept, "deserved_gpus": 0.25, "strict_fifo": True}
    r = await http.post("/api/v1/projects", json=body, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (201, queue(proj, "project", dept, quota(0.25), strict_fifo=True))


async def test_a_name_is_one_department_or_project_across_both(http: httpx.AsyncClient, make: Factory) -> None:
    dept = await make.department()
    proj = await make.project(dept)
    for path, name in (("/api/v1/departments", proj), ("/api/v1/projects", dept)):
        r = await http.post(path, json={"name": name}, headers=make.admin.auth)
        assert (r.status_code, r.json()) == (409, {"detail": f"a department or project named {name!r} already exists"})


@pytest.mark.parametrize(
    ("body", "loc", "kind"),
    [
        ({"name": "Research"}, ["body", "name"], "value_error"),
        ({"name": "-research"}, ["body", "name"], "value_error"),
        ({"name": "x" * 64}, ["body", "name"], "value_error"),
        ({"name": "r", "deserved_gpus": -1}, ["body", "deserved_gpus"], "greater_than_equal"),
        ({"name": "r", "weight": 1001}, ["body", "weight"], "less_than_equal"),
        ({"name": "r", "budget": 3}, ["body", "budget"], "extra_forbidden"),
        ({}, ["body", "name"], "missing"),
    ],
)
async def test_a_department_that_breaks_the_schema_is_422_naming_the_field(
    http: httpx.AsyncClient, make: Factory, body: dict[str, Any], loc: list[str], kind: str
) -> None:
    r = await http.post("/api/v1/departments", json=body, headers=make.admin.auth)
    assert (r.status_code, [(e["loc"], e["type"]) for e in r.json()["detail"]]) == (422, [(loc, kind)])


async def test_a_limit_below_what_is_deserved_is_refused(http: httpx.AsyncClient, make: Factory) -> None:
    body = {"name": make.name("dept"), "deserved_gpus": 2, "limit_gpus": 1}
    r = await http.post("/api/v1/departments", json=body, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (422, {"detail": "limit (1 GPU) is below deserved (2 GPUs)"})


async def test_projects_together_deserve_no_more_than_their_department(http: httpx.AsyncClient, make: Factory) -> None:
    dept = await make.department(deserved_gpus=2)
    kept = await make.project(dept, deserved_gpus=1.5)
    refused = make.name("proj")
    body = {"name": refused, "department": dept, "deserved_gpus": 1}
    r = await http.post("/api/v1/projects", json=body, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (
        422,
        {"detail": f"the children of {dept!r} would deserve 2.5 GPUs in pool 'default', more than its own 2"},
    )
    names = [q["name"] for q in (await http.get("/api/v1/projects", headers=make.admin.auth)).json()]
    assert kept in names and refused not in names


async def test_a_project_goes_into_an_existing_department_only(http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project()
    for parent in ("nowhere", proj):
        body = {"name": make.name("proj"), "department": parent}
        r = await http.post("/api/v1/projects", json=body, headers=make.admin.auth)
        assert (r.status_code, r.json()) == (404, {"detail": f"no department named {parent!r}"})


async def test_lists_are_sorted_by_name_and_hold_what_the_caller_may_see(
    http: httpx.AsyncClient, make: Factory
) -> None:
    dept = await make.department()
    ours = sorted([await make.project(dept), await make.project(dept)])
    await make.project()  # another department's
    member = await make.user(ours[1])
    every = [q["name"] for q in (await http.get("/api/v1/projects", headers=make.admin.auth)).json()]
    assert every == sorted(every) and set(ours) <= set(every)
    seen = (await http.get("/api/v1/projects", headers=member.auth)).json()
    assert seen == [queue(ours[1], "project", dept, quota(1))]
    departments = (await http.get("/api/v1/departments", headers=member.auth)).json()
    assert departments == [queue(dept, "department", None, quota(8))]


async def test_a_quota_change_sets_only_what_it_names(http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project(deserved_gpus=1)
    path = f"/api/v1/queues/{proj}/quota"
    r = await http.patch(path, json={"deserved_gpus": 0.5, "limit_gpus": 1}, headers=make.admin.auth)
    assert (r.status_code, r.json()["quotas"]) == (200, [quota(0.5, 1)])
    r = await http.patch(path, json={"weight": 3}, headers=make.admin.auth)
    assert r.json()["quotas"] == [quota(0.5, 1, 3)]
    r = await http.patch(path, json={"clear_limit": True}, headers=make.admin.auth)
    assert r.json()["quotas"] == [quota(0.5, None, 3)]
    r = await http.patch(path, json={"pool": "a100", "weight": 2}, headers=make.admin.auth)
    assert r.json()["quotas"] == [quota(0, None, 2, "a100"), quota(0.5, None, 3)]


async def test_a_quota_change_that_breaks_a_rule_changes_nothing(http: httpx.AsyncClient, make: Factory) -> None:
    dept = await make.department(deserved_gpus=2)
    proj = await make.project(dept, deserved_gpus=2)
    r = await http.patch(f"/api/v1/queues/{proj}/quota", json={"limit_gpus": 1}, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (422, {"detail": "limit is below deserved"})
    r = await http.patch(f"/api/v1/queues/{dept}/quota", json={"deserved_gpus": 1}, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (
        422,
        {"detail": f"the children of {dept!r} would deserve 2 GPUs in pool 'default', more than its own 1"},
    )
    listed = {q["name"]: q["quotas"] for q in (await http.get("/api/v1/projects", headers=make.admin.auth)).json()}
    assert listed[proj] == [quota(2)]
    listed = {q["name"]: q["quotas"] for q in (await http.get("/api/v1/departments", headers=make.admin.auth)).json()}
    assert listed[dept] == [quota(2)]


async def test_the_quota_of_no_such_queue_is_404(http: httpx.AsyncClient, make: Factory) -> None:
    r = await http.patch("/api/v1/queues/nowhere/quota", json={"weight": 1}, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (404, {"detail": "no department or project named 'nowhere'"})


async def test_a_policy_is_inherited_and_a_project_may_only_tighten_it(http: httpx.AsyncClient, make: Factory) -> None:
    dept = await make.department()
    proj = await make.project(dept)
    r = await http.get(f"/api/v1/queues/{proj}/policy", headers=make.admin.auth)
    assert (r.status_code, r.json()) == (200, {
        "queue": proj, "own": {}, "idle_timeout_s": {}, "max_runtime_s": {}, "idle_threshold_pct": 5, "source": {},
    })  # fmt: skip
    await make.ok("PATCH", f"/api/v1/queues/{dept}/policy", {"idle_timeout_s": {"notebook": 3600}})
    r = await http.get(f"/api/v1/queues/{proj}/policy", headers=make.admin.auth)
    assert (r.json()["idle_timeout_s"], r.json()["source"]) == ({"notebook": 3600}, {"idle_timeout.notebook": dept})
    change = {"idle_timeout_s": {"notebook": 600}, "max_runtime_s": {"batch": 86400}, "idle_threshold_pct": 10}
    r = await http.patch(f"/api/v1/queues/{proj}/policy", json=change, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (200, {
        "queue": proj,
        "own": {"idle_timeout": {"notebook": 600}, "max_runtime": {"batch": 86400}, "idle_threshold_pct": 10},
        "idle_timeout_s": {"notebook": 600}, "max_runtime_s": {"batch": 86400}, "idle_threshold_pct": 10,
        "source": {"idle_timeout.notebook": proj, "max_runtime.batch": proj, "idle_threshold_pct": proj},
    })  # fmt: skip
    r = await http.patch(f"/api/v1/queues/{proj}/policy", json={"idle_timeout_s": {"notebook": None}},
                         headers=make.admin.auth)  # fmt: skip
    assert (r.json()["own"]["idle_timeout"], r.json()["idle_timeout_s"]) == ({}, {"notebook": 3600})


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"idle_timeout_s": {"notebook": 7200}}, "{p!r} may only tighten: notebook idle timeout 7200s is looser than "
                                                 "3600s above it"),
        ({"idle_timeout_s": {"training": 0}}, "idle_timeout for training must be positive (or null to remove it)"),
        ({"max_runtime_s": {"batch": -5}}, "max_runtime for batch must be positive (or null to remove it)"),
        ({"idle_threshold_pct": 2}, "{p!r} may only tighten: idle threshold 2% is below 5%"),
    ],
)  # fmt: skip
async def test_a_policy_change_that_loosens_or_is_not_positive_is_422(
    http: httpx.AsyncClient, make: Factory, change: dict[str, Any], reason: str
) -> None:
    dept = await make.department()
    proj = await make.project(dept)
    await make.ok("PATCH", f"/api/v1/queues/{dept}/policy", {"idle_timeout_s": {"notebook": 3600}})
    r = await http.patch(f"/api/v1/queues/{proj}/policy", json=change, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (422, {"detail": reason.format(p=proj)})
    assert (await http.get(f"/api/v1/queues/{proj}/policy", headers=make.admin.auth)).json()["own"] == {}


async def test_a_policy_for_an_unknown_kind_of_workload_is_422(http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project()
    r = await http.patch(f"/api/v1/queues/{proj}/policy", json={"idle_timeout_s": {"gpu": 60}},
                         headers=make.admin.auth)  # fmt: skip
    assert (r.status_code, [(e["loc"], e["type"]) for e in r.json()["detail"]]) == (
        422, [(["body", "idle_timeout_s", "gpu", "[key]"], "literal_error")],
    )  # fmt: skip


async def test_a_user_is_created_with_a_token_shown_once(http: httpx.AsyncClient, make: Factory) -> None:
    b, a = await make.project(), await make.project()
    name = make.name("user")
    r = await http.post("/api/v1/users", json={"name": name, "role": "viewer", "projects": [b, a, b]},
                        headers=make.admin.auth)  # fmt: skip
    made = r.json()
    assert (r.status_code, r.headers["cache-control"], made["token"][:3]) == (201, "no-store", "gp_")
    assert {k: v for k, v in made.items() if k != "token"} == {
        "name": name,
        "role": "viewer",
        "projects": sorted([a, b]),
        "state": "active",
    }
    listed = [u for u in (await http.get("/api/v1/users", headers=make.admin.auth)).json() if u["name"] == name]
    assert listed == [{"name": name, "role": "viewer", "projects": sorted([a, b]), "state": "active"}]
    again = await http.post("/api/v1/users", json={"name": name}, headers=make.admin.auth)
    assert (again.status_code, again.json()) == (409, {"detail": f"a user named {name!r} already exists"})


async def test_a_user_of_no_such_project_is_not_created(http: httpx.AsyncClient, make: Factory) -> None:
    name = make.name("user")
    r = await http.post("/api/v1/users", json={"name": name, "projects": ["nowhere"]}, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (404, {"detail": "no project named 'nowhere'"})
    assert name not in [u["name"] for u in (await http.get("/api/v1/users", headers=make.admin.auth)).json()]


async def test_a_department_admin_lists_the_people_of_its_projects_only(http: httpx.AsyncClient, make: Factory) -> None:
    dept = await make.department()
    proj = await make.project(dept)
    boss = await make.department_admin(dept)
    ours, theirs = await make.user(proj), await make.user(await make.project())
    names = [u["name"] for u in (await http.get("/api/v1/users", headers=boss.auth)).json()]
    assert ours.name in names and theirs.name not in names and names == sorted(names)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/api/v1/queues/a%00b/policy", None),
        ("PATCH", "/api/v1/queues/a%00b/policy", {}),
        ("PATCH", "/api/v1/queues/a%00b/quota", {}),
    ],
)
async def test_a_queue_name_with_a_nul_byte_is_refused(
    http: httpx.AsyncClient, make: Factory, method: str, path: str, body: Any
) -> None:
    r = await http.request(method, path, json=body, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (422, {"detail": "a NUL byte is not allowed in a path or a query"})


async def test_a_user_in_a_project_named_with_a_nul_byte_is_not_created(http: httpx.AsyncClient, make: Factory) -> None:
    r = await http.post("/api/v1/users", json={"name": make.name("user"), "projects": [NUL]}, headers=make.admin.auth)
    issues = [(e["loc"], e["type"]) for e in r.json()["detail"]]
    assert (r.status_code, issues) == (422, [(["body", "projects", 0], "string_pattern_mismatch")])
