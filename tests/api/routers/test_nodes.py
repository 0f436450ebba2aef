"""The nodes router: the GPU map, every device with what is allocated on it, and to which workloads; another
tenant's workload is shown without its name."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.api.inprocess import Api
from tests.api.routers.factories import Factory, client

pytestmark = pytest.mark.anyio


async def test_the_map_shows_every_device_of_the_node(http: httpx.AsyncClient, make: Factory, api: Api) -> None:
    (node,) = api.ctx.backend.inventory()
    r = await http.get("/api/v1/nodes", headers=make.admin.auth)
    assert r.status_code == 200
    (got,) = r.json()
    assert {k: got[k] for k in ("name", "pool", "backend", "schedulable", "cpu_milli", "memory_mib")} == {
        "name": node.name, "pool": "default", "backend": "local", "schedulable": True, "cpu_milli": node.cpu_milli,
        "memory_mib": node.memory_mib,
    }  # fmt: skip
    assert got["devices"] == [
        {"index": i, "model": d.model, "memory_mib": d.memory_mib, "allocated_milli": 0, "workloads": []}
        for i, d in enumerate(node.devices)
    ]
    assert len(got["devices"]) == 4


async def test_a_running_workload_is_named_to_its_tenant_only(fresh_api: Callable[..., Api]) -> None:
    api = fresh_api(gpus="fake:1xH100-80GB")
    async with client(api) as http:
        make = Factory(api, http)
        mine, theirs = await make.project(), await make.project()
        insider, outsider = await make.user(mine), await make.user(theirs)
        job = await make.workload(mine, gpu=0.5, command=["sleep", "600"])
        await make.until_state(job, "running")
        seen = {}
        for who in (insider, outsider):
            (node,) = (await http.get("/api/v1/nodes", headers=who.auth)).json()
            seen[who.name] = [(d["allocated_milli"], d["workloads"]) for d in node["devices"]]
        assert seen == {insider.name: [(500, [job["name"]])], outsider.name: [(500, ["(another project)"])]}
