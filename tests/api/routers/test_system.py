"""The system router: /healthz, /metrics (Prometheus's text format) and /api/v1/whoami."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpupool import __version__
from tests.api.routers.factories import Factory

pytestmark = pytest.mark.anyio


def samples(text: str, metric: str) -> dict[tuple[tuple[str, str], ...], float]:
    """One metric's samples from a scrape, keyed by their labels."""
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == metric
    }


async def test_healthz_answers_without_a_token(http: httpx.AsyncClient) -> None:
    r = await http.get("/healthz")
    assert (r.status_code, r.json()) == (200, {"status": "ok", "version": __version__})


async def test_whoami_names_the_caller_the_projects_it_reaches_and_the_departments_it_runs(
    http: httpx.AsyncClient, make: Factory
) -> None:
    dept = await make.department()
    a, b = sorted([await make.project(dept), await make.project(dept)])
    member = await make.user(b, a)
    boss = await make.department_admin(dept)
    got = [(await http.get("/api/v1/whoami", headers=p.auth)).json() for p in (make.admin, member, boss)]
    assert got == [
        {"name": "admin", "role": "admin", "projects": [], "departments": []},
        {"name": member.name, "role": "member", "projects": [a, b], "departments": []},
        {"name": boss.name, "role": "department-admin", "projects": [a, b], "departments": [dept]},
    ]


async def test_whoami_without_a_token_is_401_asking_for_a_bearer(http: httpx.AsyncClient) -> None:
    r = await http.get("/api/v1/whoami")
    assert (r.status_code, r.json(), r.headers["www-authenticate"]) == (
        401,
        {"detail": "a valid bearer token is required"},
        "Bearer",
    )


async def test_metrics_count_what_waits_and_what_is_guaranteed_per_project(
    http: httpx.AsyncClient, make: Factory
) -> None:
    project = await make.project(deserved_gpus=1.5)
    for _ in range(3):
        await make.workload(project)
    r = await http.get("/metrics", headers=make.admin.auth)
    assert (r.status_code, r.headers["content-type"]) == (200, "text/plain; version=1.0.0; charset=utf-8")
    assert samples(r.text, "gpupool_queue_depth")[(("project", project),)] == 3
    assert samples(r.text, "gpupool_project_deserved_gpus")[(("pool", "default"), ("project", project))] == 1.5
    assert samples(r.text, "gpupool_project_allocated_gpus")[(("project", project),)] == 0


async def test_a_members_scrape_counts_workloads_of_its_projects_only(http: httpx.AsyncClient, make: Factory) -> None:
    mine, theirs = await make.project(), await make.project()
    member = await make.user(mine)
    await make.workload(mine)
    for _ in range(2):
        await make.workload(theirs)
    r = await http.get("/metrics", headers=member.auth)
    assert samples(r.text, "gpupool_workloads") == {(("state", "pending"),): 1}
    assert set(samples(r.text, "gpupool_queue_depth")) == {(("project", mine),)}


async def test_a_revoked_scrape_token_reads_nothing(http: httpx.AsyncClient, make: Factory) -> None:
    scrape = await make.ok("POST", "/api/v1/tokens", {"name": make.name("prom"), "kind": "metrics"})
    assert (await http.get("/metrics", headers={"Authorization": f"Bearer {scrape['token']}"})).status_code == 200
    await make.ok("DELETE", f"/api/v1/tokens/{scrape['id']}")
    r = await http.get("/metrics", headers={"Authorization": f"Bearer {scrape['token']}"})
    assert (r.status_code, r.json()) == (401, {"detail": "a valid bearer token is required"})
