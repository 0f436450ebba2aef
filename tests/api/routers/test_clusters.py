"""The clusters router: the hub's own cluster and the spokes admins add, drain and remove, and what a bad
kubeconfig, a clash or a busy cluster gets back. (Spokes that are reached and run work: tests/kubernetes/
test_fleet.py.)"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.api.inprocess import KUBECONFIG, Api
from tests.api.routers.factories import Factory, client

pytestmark = pytest.mark.anyio


async def test_the_home_cluster_and_a_spoke_are_listed_and_the_spoke_drained_and_removed(
    fresh_api: Callable[..., Api],
) -> None:
    api = fresh_api(gpus="fake:2xH100-80GB")
    async with client(api) as http:
        make = Factory(api, http)
        admin = make.admin.auth
        r = await http.get("/api/v1/clusters", headers=admin)
        home = {
            "name": "home", "kind": "home", "status": "up", "draining": False, "pool_scope": "global",
            "pool_label": None, "burst": None, "last_seen_at": None, "down_since": None, "nodes": 1, "gpus": 2,
            "allocated_gpus": 0.0, "workloads": 0,
        }  # fmt: skip
        assert (r.status_code, r.json()) == (200, [home])
        body = {"name": "east", "kubeconfig": KUBECONFIG, "pool_scope": "cluster", "pool_label": "example.com/pool"}
        r = await http.post("/api/v1/clusters", json=body, headers=admin)
        east = {**home, "name": "east", "kind": "kubernetes", "status": "unknown", "pool_scope": "cluster",
                "pool_label": "example.com/pool", "nodes": 0, "gpus": 0}  # fmt: skip
        assert (r.status_code, r.json()) == (201, east)
        assert "kubeconfig" not in r.text  # a secret: never shown back
        member = await make.user()
        assert (await http.get("/api/v1/clusters", headers=member.auth)).json() == [home, east]
        r = await http.get("/api/v1/clusters/east", headers=member.auth)
        assert (r.status_code, r.json()) == (403, {"detail": "only an admin may do this"})
        r = await http.get("/api/v1/clusters/home", headers=admin)
        assert r.json() | {"node_names": None} == home | {
            "pools": ["default"],
            "node_names": None,
            "running": [],
            "burst_nodes": [],
        }
        r = await http.post("/api/v1/clusters/east/drain", json={"draining": True}, headers=admin)
        assert (r.status_code, r.json()["draining"]) == (200, True)
        r = await http.post("/api/v1/clusters/home/drain", json={"draining": True}, headers=admin)
        cordon = "'home' is the hub's own cluster: cordon its nodes instead"
        assert (r.status_code, r.json()) == (422, {"detail": cordon})
        assert (await http.delete("/api/v1/clusters/east", headers=admin)).status_code == 204
        assert [c["name"] for c in (await http.get("/api/v1/clusters", headers=admin)).json()] == ["home"]
        r = await http.delete("/api/v1/clusters/home", headers=admin)
        assert (r.status_code, r.json()) == (422, {"detail": "'home' is the hub's own cluster and cannot be removed"})


@pytest.mark.parametrize(
    ("body", "status", "detail"),
    [
        ({"name": "home", "kubeconfig": KUBECONFIG}, 409, "a cluster named 'home' already exists"),
        ({"name": "x"}, 422, "give a cluster either a kubeconfig or --local (this host), not both nor neither"),
        ({"name": "x", "kubeconfig": KUBECONFIG, "local": True}, 422,
         "give a cluster either a kubeconfig or --local (this host), not both nor neither"),
        ({"name": "x", "local": True}, 409, "this host is already the hub's own cluster 'home'"),
        ({"name": "x", "kubeconfig": "a: [b"}, 422, None),
        ({"name": "x", "kubeconfig": "just text"}, 422,
         "the kubeconfig names no cluster and context (kubectl config view --minify --raw makes one)"),
        ({"name": "x", "kubeconfig": KUBECONFIG.replace("current-context: far", "current-context: near")}, 422,
         "the kubeconfig's current-context 'near' is not among its contexts"),
    ],
)  # fmt: skip
async def test_a_bad_cluster_is_refused_with_its_reason_and_nothing_written(
    http: httpx.AsyncClient, make: Factory, body: dict[str, object], status: int, detail: str | None
) -> None:
    before = (await http.get("/api/v1/clusters", headers=make.admin.auth)).json()
    r = await http.post("/api/v1/clusters", json=body, headers=make.admin.auth)
    assert r.status_code == status, r.text
    if detail is None:
        assert r.json()["detail"].startswith("the kubeconfig is not YAML: ")
    else:
        assert r.json() == {"detail": detail}
    assert (await http.get("/api/v1/clusters", headers=make.admin.auth)).json() == before


async def test_a_cluster_that_runs_work_cannot_be_removed_and_a_workload_names_only_known_clusters(
    fresh_api: Callable[..., Api],
) -> None:
    api = fresh_api(gpus="fake:2xH100-80GB")
    async with client(api) as http:
        make = Factory(api, http)
        project = await make.project(deserved_gpus=2)
        r = await http.post(
            "/api/v1/workloads",
            json={"project": project, "command": ["true"], "clusters": ["north"]},
            headers=make.admin.auth,
        )
        assert (r.status_code, r.json()) == (422, {"detail": "unknown cluster 'north'; clusters: home"})
        w = await make.workload(project, gpus=1, command=["sleep", "inf"], clusters=["home"])
        seen = await make.until_state(w, "running")
        assert seen["clusters"] == ["home"] and seen["on_cluster_lost"] == {"action": "requeue", "after_s": 900.0}
        listed = {c["name"]: c for c in (await http.get("/api/v1/clusters", headers=make.admin.auth)).json()}
        assert (listed["home"]["allocated_gpus"], listed["home"]["workloads"]) == (1.0, 1)
        r = await http.get("/api/v1/clusters/home", headers=make.admin.auth)
        assert r.json()["running"] == [f"{project}/{w['name']}"]
        # Notebooks wait for their cluster by default (their files are there); a policy given is kept as given.
        for fields, policy in (
            ({"type": "notebook", "command": []}, {"action": "wait", "after_s": 900.0}),
            ({"on_cluster_lost": {"action": "requeue", "after_s": 60}}, {"action": "requeue", "after_s": 60.0}),
        ):
            made = await make.workload(project, gpu=0.25, **fields)
            detail = await make.ok("GET", f"/api/v1/workloads/{made['id']}")
            assert detail["on_cluster_lost"] == policy


async def test_a_burst_cluster_keeps_its_price_and_size_and_a_department_its_threshold_and_budget(
    fresh_api: Callable[..., Api],
) -> None:
    api = fresh_api(gpus="fake:2xH100-80GB")
    async with client(api) as http:
        make = Factory(api, http)
        admin = make.admin.auth
        burst = {"price_per_gpu_hour": 2.5, "max_gpus": 64, "delay_s": 120, "idle_release_s": 300}
        r = await http.post("/api/v1/clusters", json={"name": "cloud", "kubeconfig": KUBECONFIG, "burst": burst},
                            headers=admin)  # fmt: skip
        assert (r.status_code, r.json()["burst"]) == (201, burst | {"node_gpus": 8, "gpu_model": None})
        r = await http.post("/api/v1/clusters", json={"name": "lab", "local": True, "burst": burst}, headers=admin)
        local = "burst capacity is asked of a Kubernetes cluster's autoscaler: give a kubeconfig, not --local"
        assert (r.status_code, r.json()) == (422, {"detail": local})
        r = await http.post("/api/v1/clusters", json={"name": "c2", "kubeconfig": KUBECONFIG,
                            "burst": {"price_per_gpu_hour": -1, "max_gpus": 0}}, headers=admin)  # fmt: skip
        assert r.status_code == 422 and [e["loc"][-1] for e in r.json()["detail"]] == ["price_per_gpu_hour", "max_gpus"]
        modelled = burst | {"gpu_model": "NVIDIA-H100-80GB-HBM3"}
        r = await http.post("/api/v1/clusters", json={"name": "c3", "kubeconfig": KUBECONFIG, "burst": modelled},
                            headers=admin)  # fmt: skip
        assert (r.status_code, r.json()["burst"]) == (201, modelled | {"node_gpus": 8})

        department = await make.department()
        project = await make.project(department)
        member = await make.user(project)
        path = f"/api/v1/departments/{department}/burst"
        # Nothing rented yet: nothing spent (what it spends is tests/api/routers/test_burst_costs.py's).
        idle = {"paced": True, "stop_at_budget": True, "spent": 0.0, "forecast": 0.0, "rate_per_hour": 0.0,
                "nodes": 0, "refused": None}  # fmt: skip
        assert (await http.get(path, headers=member.auth)).json() == {
            "department": department, "after_s": None, "monthly_budget": None, **idle
        }  # fmt: skip
        r = await http.put(path, json={"monthly_budget": 5000}, headers=admin)  # the default threshold: 30 min
        assert r.json() == {"department": department, "after_s": 1800.0, "monthly_budget": 5000.0, **idle}
        r = await http.put(path, json={"after_s": 600, "monthly_budget": 0.5}, headers=admin)
        assert r.json() == {"department": department, "after_s": 600.0, "monthly_budget": 0.5, **idle}
        r = await http.put(path, json={"after_s": 600}, headers=admin)
        assert (r.status_code, r.json()) == (
            422, {"detail": "a department bursts within a monthly budget: give one (0 stops it bursting)"}
        )  # fmt: skip
        r = await http.put(path, json={"monthly_budget": 100}, headers=member.auth)
        assert (r.status_code, r.json()) == (403, {"detail": "only an admin may do this"})
        assert (await http.get(path, headers=member.auth)).json()["monthly_budget"] == 0.5  # nothing written
        r = await http.put(path, json={}, headers=admin)
        assert r.json() == {"department": department, "after_s": None, "monthly_budget": None, **idle}
        r = await http.put(f"/api/v1/departments/{project}/burst", json={}, headers=admin)
        assert (r.status_code, r.json()) == (404, {"detail": f"no department named {project!r}"})
