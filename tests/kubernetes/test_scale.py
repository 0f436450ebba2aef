"""300 mixed workloads on 50 simulated nodes × 8 GPUs through the API: nothing is ever over-committed, fractions
sit on reserved devices, and every completion flows back."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from gpupool.models.schemas import DepartmentCreate, ProjectCreate, WorkloadCreate
from kubernetes import client
from tests.e2e.conftest import Server, wait_for
from tests.kubernetes.cluster import Cluster


def _check_commitments(cluster: Cluster) -> int:
    """Whole GPUs (workload pods plus reservations) per node never exceed 8, and every fractional pod's device
    is held by a reservation pod on its node. Returns how many pods it looked at."""
    pods = client.CoreV1Api(cluster.api()).list_pod_for_all_namespaces(label_selector="gpupool.io/managed=true").items
    used: dict[str, int] = {}
    reserved: set[tuple[str, str]] = set()
    fractional: list[tuple[str, str]] = []
    for p in pods:
        if p.status.phase in ("Succeeded", "Failed") or p.metadata.deletion_timestamp:
            continue  # ended, or going (a released reservation is deleted with no grace)
        limits = p.spec.containers[0].resources.limits or {}
        used[p.spec.node_name] = used.get(p.spec.node_name, 0) + int(limits.get("nvidia.com/gpu", 0))
        labels = p.metadata.labels or {}
        if labels.get("gpupool.io/reservation"):
            reserved.add((p.spec.node_name, labels["gpupool.io/device"]))
        env = {e.name: e.value for e in p.spec.containers[0].env or []}
        if "GPUPOOL_GPU_FRACTION" in env:
            fractional.append((p.spec.node_name, env["NVIDIA_VISIBLE_DEVICES"].rsplit("-", 1)[1]))
    assert all(n <= 8 for n in used.values()), used
    assert all(f in reserved for f in fractional), sorted(set(fractional) - reserved)[:5]
    return len(pods)


def test_three_hundred_mixed_workloads_on_fifty_nodes(cluster: Cluster, kube_server: Callable[..., Server]) -> None:
    nodes = cluster.add_gpu_nodes(50, prefix="scale")
    s = kube_server()
    wait_for(lambda: sum(1 for n in s.json("nodes") if n["name"] in nodes and n["schedulable"]) == 50, 60, "50 nodes")
    c = s.client()
    for dept in ("research", "product"):
        c.create_department(DepartmentCreate(name=dept, deserved_gpus=200, pool="h100"))
        for team in ("a", "b"):
            c.create_project(ProjectCreate(name=f"{dept}-{team}", department=dept, deserved_gpus=100, pool="h100"))
    rng = random.Random(7)
    names = []
    for i in range(300):
        shape: dict[str, Any] = rng.choice(
            [{"gpus": rng.choice([1, 2, 4, 8])}, {"gpu": rng.choice([0.25, 0.5])}, {"gpus": 4, "workers": 2}]
        )
        kind = rng.choice(["training", "batch", "inference"]) if "workers" not in shape else "training"
        project = rng.choice(["research-a", "research-b", "product-a", "product-b"])
        env = {"RUN_FOR": f"{rng.randint(2, 8)}s"}
        body = WorkloadCreate(project=project, name=f"w{i}", type=kind, command=["run"], env=env, **shape)
        c.submit(body)
        names.append(body.name)
    looked = 0

    def all_done() -> bool:
        nonlocal looked
        looked = max(looked, _check_commitments(cluster))
        states = [w.state for w in c.list_workloads()]
        return all(st == "succeeded" for st in states) and len(states) == 300

    wait_for(all_done, 240, "all 300 workloads to succeed")
    assert looked > 50
    assert _check_commitments(cluster) >= 0
    metrics = c.metrics()
    assert 'gpupool_workloads{state="succeeded"} 300.0' in metrics
