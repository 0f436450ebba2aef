"""gpupool on a real Kubernetes API server: decisions become bound pods, and pod phases come back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client
from tests.e2e.conftest import Server, wait_for
from tests.kubernetes.cluster import Cluster


def _pods(cluster: Cluster) -> list[Any]:
    return list(
        client.CoreV1Api(cluster.api()).list_pod_for_all_namespaces(label_selector="gpupool.io/managed=true").items
    )


def _gpus_per_node(cluster: Cluster) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in _pods(cluster):
        if p.metadata.deletion_timestamp:
            continue
        for c in p.spec.containers:
            n = int(((c.resources.limits or {}).get("nvidia.com/gpu")) or 0)
            out[p.spec.node_name] = out.get(p.spec.node_name, 0) + n
    return out


def lab(
    cluster: Cluster, kube_server: Callable[..., Server], prefix: str, projects: dict[str, int]
) -> tuple[Server, list[str]]:
    """Two 8-GPU nodes seen by a new server, and department lab (16 GPUs) with the given projects."""
    nodes = cluster.add_gpu_nodes(2, prefix=prefix)
    s = kube_server()
    wait_for(lambda: sum(1 for n in s.json("nodes") if n["name"] in nodes and n["schedulable"]) == 2, 30, "nodes")
    s.cli("department", "create", "lab", "--deserved-gpus", "16", "--pool", "h100")
    for project, gpus in projects.items():
        s.cli("project", "create", project, "--department", "lab", "--deserved-gpus", str(gpus), "--pool", "h100")
    return s, nodes


def test_workloads_become_bound_pods_and_their_phases_drive_states(
    cluster: Cluster, kube_server: Callable[..., Server]
) -> None:
    nodes = cluster.add_gpu_nodes(2, prefix="basic")
    s = kube_server()
    wait_for(lambda: len([n for n in s.json("nodes") if n["name"] in nodes]) == 2, 30, "gpupool to see the nodes")
    s.cli("project", "create", "vision", "--deserved-gpus", "16", "--pool", "h100")
    s.cli("submit", "-p", "vision", "--name", "whole", "--gpus", "2", "--env", "RUN_FOR=9s", "--", "python", "train.py")
    s.cli("submit", "-p", "vision", "--name", "quarter", "--gpu", "0.25", "--", "sleep", "inf")
    s.cli(
        "submit",
        "-p",
        "vision",
        "--name",
        "broken",
        "--gpus",
        "1",
        "--env",
        "RUN_FOR=1s",
        "--env",
        "EXIT_CODE=1",
        "--",
        "false",
    )
    s.cli("submit", "-p", "vision", "--name", "ddp", "--workers", "2", "--gpus", "4", "--", "torchrun", "train.py")
    s.wait_state("whole", "running")
    s.wait_state("quarter", "running")
    s.wait_state("ddp", "running")
    by_name = {
        p.metadata.labels["gpupool.io/workload"]: p
        for p in _pods(cluster)
        if p.metadata.labels.get("gpupool.io/workload")
    }
    assert by_name["whole"].spec.scheduler_name == "gpupool" and by_name["whole"].spec.node_name in nodes
    reservations = [p for p in _pods(cluster) if p.metadata.labels.get("gpupool.io/reservation")]
    assert len(reservations) == 1 and reservations[0].spec.node_name == by_name["quarter"].spec.node_name
    env = {e.name: e.value for e in by_name["quarter"].spec.containers[0].env}
    assert env["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-") and env["GPUPOOL_GPU_FRACTION"] == "0.250"
    gang = [p for p in _pods(cluster) if p.metadata.labels.get("gpupool.io/workload") == "ddp"]
    assert len(gang) == 2 and {e.name for e in gang[0].spec.containers[0].env} >= {"MASTER_ADDR", "RANK", "WORLD_SIZE"}
    assert all(n <= 8 for n in _gpus_per_node(cluster).values())
    assert s.wait_state("whole", "succeeded", timeout=60)["exit_code"] == 0
    assert s.wait_state("broken", "failed", timeout=30)["exit_code"] == 1
    s.cli("cancel", "quarter")
    s.wait_state("quarter", "cancelled", timeout=30)
    wait_for(
        lambda: not [p for p in _pods(cluster) if p.metadata.labels.get("gpupool.io/reservation")],
        30,
        "the reservation to go with its last sharer",
    )
    # A restarted gpupool adopts the pods it finds and makes no second copy.
    before = sorted(p.metadata.name for p in _pods(cluster))
    s.kill()
    s.start()
    assert s.workload("ddp")["state"] == "running"
    assert sorted(p.metadata.name for p in _pods(cluster)) == before
    s.cli("cancel", "ddp")
    s.wait_state("ddp", "cancelled", timeout=30)


def test_reclaim_deletes_the_borrowers_pods_and_a_lost_node_sends_its_work_back(
    cluster: Cluster, kube_server: Callable[..., Server]
) -> None:
    s, _ = lab(cluster, kube_server, "reclaim", {"borrower": 8, "owner": 8})
    for i in range(4):
        s.cli("submit", "-p", "borrower", "--type", "batch", "--name", f"b{i}", "--gpus", "4", "--", "sleep", "inf")
    for i in range(4):
        s.wait_state(f"b{i}", "running")
    assert sum(_gpus_per_node(cluster).values()) == 16
    s.cli("submit", "-p", "owner", "--name", "mine", "--gpus", "8", "--", "sleep", "inf")
    s.wait_state("mine", "running", timeout=60)
    states = sorted(s.workload(f"b{i}")["state"] for i in range(4))
    assert states == ["preempted", "preempted", "running", "running"]
    live = [
        p for p in _pods(cluster) if not p.metadata.deletion_timestamp and p.metadata.labels.get("gpupool.io/workload")
    ]
    assert sorted(p.metadata.labels["gpupool.io/workload"] for p in live) == sorted(
        ["mine"] + [f"b{i}" for i in range(4) if s.workload(f"b{i}")["state"] == "running"]
    )
    assert all(n <= 8 for n in _gpus_per_node(cluster).values())
    # The node under `mine` goes away: its work is sent back and starts again where there is room.
    lost = s.workload("mine")["node"]
    client.CoreV1Api(cluster.api()).delete_node(lost)
    w = wait_for(lambda: (d := s.workload("mine")) and d["attempt"] >= 1 and d, 60, "mine to be requeued")
    assert any("node" in e["reason"] and "lost" in e["reason"] for e in w["events"])


def test_an_owed_whole_node_moves_a_within_quota_pod_and_reclaims_the_rest(
    cluster: Cluster, kube_server: Callable[..., Server]
) -> None:
    """Each node runs a pod of `holder` (within its quota) beside `borrower`'s; `owner` is owed a whole node."""
    s, nodes = lab(cluster, kube_server, "moves", {"holder": 8, "owner": 8, "borrower": 0})

    def run(project: str, name: str, gpus: int) -> None:
        s.cli("submit", "-p", project, "--type", "batch", "--name", name, "--gpus", str(gpus), "--", "sleep", "inf")
        s.wait_state(name, "running")

    run("holder", "h-big", 7)
    run("borrower", "b-fill", 1)  # fills h-big's node
    run("holder", "h-one", 1)  # so h-one has the other node, where the borrower fills the rest
    for i in range(7):
        run("borrower", f"b{i}", 1)
    target = s.workload("h-one")["node"]
    s.cli("submit", "-p", "owner", "--name", "mine", "--gpus", "8", "--", "sleep", "inf")
    s.wait_state("mine", "running", timeout=60)
    assert s.workload("mine")["node"] == target
    moved = wait_for(lambda: (w := s.workload("h-one")) and w["state"] == "running" and w["attempt"] == 1 and w, 60,
                     "h-one to restart on the other node")  # fmt: skip
    assert moved["node"] != target
    moves = [e["reason"] for e in moved["events"] if e["code"] == "stop-requested"]
    assert moves == ["consolidate: moved to make room for a workload of project owner, which its project is owed; "
                     "it restarts on another node; stopping"]  # fmt: skip
    borrower = [s.workload(n)["state"] for n in ("b-fill", *(f"b{i}" for i in range(7)))]
    assert borrower == ["preempted"] * 8
    assert s.workload("h-big")["state"] == "running" and s.workload("h-big")["attempt"] == 0
    assert _gpus_per_node(cluster) == {nodes[0]: 8, nodes[1]: 8}


def test_in_project_preemption_deletes_the_lowest_priority_pods(
    cluster: Cluster, kube_server: Callable[..., Server]
) -> None:
    (node,) = cluster.add_gpu_nodes(1, prefix="preempt")
    s = kube_server()
    wait_for(lambda: any(n["name"] == node and n["schedulable"] for n in s.json("nodes")), 30, "the node")
    s.cli("project", "create", "team", "--deserved-gpus", "8", "--pool", "h100")
    for i in range(8):
        s.cli("submit", "-p", "team", "--type", "batch", "--name", f"sweep{i}", "--gpus", "1", "--", "sleep", "inf")
    for i in range(8):
        s.wait_state(f"sweep{i}", "running")
    s.cli("submit", "-p", "team", "--name", "train", "--gpus", "4", "--", "python", "train.py")
    s.wait_state("train", "running", timeout=60)
    states = [s.workload(f"sweep{i}")["state"] for i in range(8)]
    assert states.count("preempted") == 4 and states.count("running") == 4
    live = {
        p.metadata.labels["gpupool.io/workload"]
        for p in _pods(cluster)
        if not p.metadata.deletion_timestamp
        and p.status.phase == "Running"
        and p.metadata.labels.get("gpupool.io/workload")
    }
    assert live == {"train"} | {f"sweep{i}" for i in range(8) if states[i] == "running"}
    assert _gpus_per_node(cluster)[node] == 8
