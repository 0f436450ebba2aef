"""Who submitted a workload (its owner, in lists and describe; lists of one user's), and the GPU models it
accepts: refused at submit where no node has them, kept and shown where one has."""

from __future__ import annotations

import httpx
import pytest

from tests.api.routers.factories import Factory

pytestmark = pytest.mark.anyio


async def test_lists_name_the_owner_and_filter_by_user(http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project()
    ann, bob = await make.user(proj), await make.user(proj)
    a = await make.workload(proj, ann)
    b = await make.workload(proj, bob)
    assert (a["owner"], b["owner"]) == (ann.name, bob.name)
    everyone = await make.ok("GET", "/api/v1/workloads", who=bob, project=proj)
    assert [(w["name"], w["owner"]) for w in everyone["items"]] == [(b["name"], bob.name), (a["name"], ann.name)]
    anns = await make.ok("GET", "/api/v1/workloads", who=bob, project=proj, user=ann.name)
    assert [w["name"] for w in anns["items"]] == [a["name"]]
    described = await make.ok("GET", f"/api/v1/workloads/{a['name']}", who=bob, project=proj)
    assert described["owner"] == ann.name


async def test_a_user_of_another_tenant_and_an_unknown_one_list_alike(http: httpx.AsyncClient, make: Factory) -> None:
    ours, theirs = await make.project(), await make.project()
    me, stranger = await make.user(ours), await make.user(theirs)
    await make.workload(theirs, stranger)
    for name in (stranger.name, "nobody-at-all"):
        page = await make.ok("GET", "/api/v1/workloads", who=me, user=name)
        assert page == {"items": [], "next_cursor": None}


async def test_a_gpu_model_no_node_has_is_refused_with_the_models_there_are(
    http: httpx.AsyncClient, make: Factory
) -> None:
    proj = await make.project()
    body = {"project": proj, "name": make.name("job"), "gpus": 1, "gpu_models": ["A100"], "command": ["true"]}
    r = await http.post("/api/v1/workloads", json=body, headers=make.admin.auth)
    assert (r.status_code, r.json()["detail"]) == (422, "no node has GPU model 'A100'; models: H100")


async def test_a_gpu_model_a_node_has_is_kept_with_the_resources_asked(http: httpx.AsyncClient, make: Factory) -> None:
    proj = await make.project()
    made = await make.workload(proj, gpus=1, gpu_models=["H100"], cpu=1.5, memory="2GiB", pools=["default"])
    out = await make.ok("GET", f"/api/v1/workloads/{made['id']}")
    asked = {k: out[k] for k in ("gpu_models", "cpu_milli", "memory_mib", "pools", "image")}
    assert asked == {"gpu_models": ["H100"], "cpu_milli": 1500, "memory_mib": 2048, "pools": ["default"],
                     "image": None}  # fmt: skip
