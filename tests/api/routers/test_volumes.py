"""Volumes through the API in-process: describe shows the volumes a workload mounts as it was submitted, and a
volume no running workload mounts is deleted through the backend's storage (made or not)."""

from __future__ import annotations

import httpx
import pytest

from tests.api.routers.factories import Factory

pytestmark = pytest.mark.anyio


async def test_describe_shows_the_volumes_a_workload_mounts(http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project()
    for name in ("scratch", "ref"):
        await make.ok("POST", "/api/v1/volumes", {"project": proj, "name": name, "size": "16MiB"})
    mounts = [{"name": "scratch", "path": "/data"}, {"name": "ref", "path": "/ref", "read_only": True}]
    made = await make.workload(proj, volumes=mounts)
    plain = await make.workload(proj)
    described = await make.ok("GET", f"/api/v1/workloads/{made['id']}")
    assert described["volumes"] == [
        {"name": "scratch", "path": "/data", "read_only": False},
        {"name": "ref", "path": "/ref", "read_only": True},
    ]
    assert (await make.ok("GET", f"/api/v1/workloads/{plain['id']}"))["volumes"] == []
    r = await http.delete("/api/v1/volumes/scratch", params={"project": proj}, headers=make.admin.auth)
    assert (r.status_code, made["name"] in r.json()["detail"]) == (409, True)
    await make.ok("POST", f"/api/v1/workloads/{made['id']}/cancel")
    r = await http.delete("/api/v1/volumes/scratch", params={"project": proj}, headers=make.admin.auth)
    assert r.status_code == 204
    listed = await make.ok("GET", "/api/v1/volumes", project=proj)
    assert [v["name"] for v in listed] == ["ref"]
