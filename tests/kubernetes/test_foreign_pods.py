"""Pods gpupool did not make: those that name it as their scheduler become workloads it binds, and those another
scheduler placed count as capacity in use. Real kube-apiserver, kwok and kube-controller-manager (for a Job)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client
from tests.e2e.conftest import Server, wait_for
from tests.kubernetes.cluster import Cluster
from tests.kubernetes.controllers import Workloads, indexed_job, poll

PROJECT = "gpupool.io/project"


def pod(name: str, labels: dict[str, str], *, gpus: int = 1, run_for: str = "", **notes: str) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "busybox", "resources": {}}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    if run_for:
        container["env"] = [{"name": "RUN_FOR", "value": run_for}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": notes},
        "spec": {"schedulerName": "gpupool", "restartPolicy": "Never", "containers": [container]},
    }


def states(s: Server) -> dict[str, str]:
    return {w["name"]: w["state"] for w in s.json("list", "-p", "vision")}


def reach(s: Server, name: str, state: str) -> dict[str, Any]:
    """Wait for a pod's workload (made when gpupool next looks at pods) to be in `state`; returns its description."""
    wait_for(lambda: states(s).get(name) == state, 30, f"{name} to be {state}")
    return s.workload(name)


def devices(s: Server, node: str) -> list[int] | None:
    """The indices of the devices gpupool offers on `node`."""
    return next(([d["index"] for d in n["devices"]] for n in s.json("nodes") if n["name"] == node), None)


def start(cluster: Cluster, kube_server: Callable[..., Server], prefix: str, gpus: int = 8) -> tuple[Server, str]:
    [node] = cluster.add_gpu_nodes(1, prefix=prefix, gpus=gpus)
    s = kube_server()
    wait_for(lambda: any(n["name"] == node and n["schedulable"] for n in s.json("nodes")), 30, "the node")
    s.cli("project", "create", "vision", "--deserved-gpus", str(gpus), "--pool", "h100")
    return s, node


def test_a_pod_naming_gpupool_is_a_workload_bound_to_a_node(
    cluster: Cluster, workloads: Workloads, kube_server: Callable[..., Server]
) -> None:
    s, node = start(cluster, kube_server, "adopt")
    workloads.core.create_namespaced_pod("default", pod("train-a", {PROJECT: "vision"}, gpus=2, run_for="2s"))
    running = workloads.wait_pods(f"{PROJECT}=vision", 1, "Running")
    assert running[0].spec.node_name == node
    w = s.wait_state("train-a", "succeeded", timeout=30)
    assert w["project"] == "vision" and w["gpus"] == 2 and w["priority"] == "training"
    assert w["origin"] == {
        "kind": "Pod", "namespace": "default", "name": "train-a", "uid": running[0].metadata.uid, "pods": [],
    }  # fmt: skip
    assert [x["name"] for x in s.json("list", "-p", "vision")] == ["train-a"]
    assert "Origin:      Pod default/train-a\n" in s.cli("describe", "train-a").stdout
    # Still there after it ended (left to its owner), and never adopted twice, by a restarted server either.
    assert workloads.pods(f"{PROJECT}=vision")[0].status.phase == "Succeeded"
    s.kill()
    s.start()
    # A pod made now is adopted by the same pass that looks at train-a again.
    workloads.core.create_namespaced_pod("default", pod("train-b", {PROJECT: "vision"}))
    both = [("train-a", "succeeded"), ("train-b", "running")]
    wait_for(lambda: sorted((w["name"], w["state"]) for w in s.json("list", "-p", "vision")) == both, 30, "train-b")
    # The project may come from the namespace's label instead of the pod's.
    workloads.core.create_namespace({"metadata": {"name": "ml", "labels": {PROJECT: "vision"}}})
    workloads.core.create_namespaced_pod("ml", pod("train-c", {}))
    try:
        assert reach(s, "train-c", "running")["origin"]["namespace"] == "ml"
    finally:
        workloads.core.delete_namespaced_pod("train-c", "ml", grace_period_seconds=0)


def test_a_pod_with_no_project_is_refused_with_an_event_and_a_condition(
    cluster: Cluster, workloads: Workloads, kube_server: Callable[..., Server]
) -> None:
    s, _ = start(cluster, kube_server, "refuse")
    workloads.core.create_namespaced_pod("default", pod("lost", {}))
    workloads.core.create_namespaced_pod("default", pod("stranger", {PROJECT: "nobody"}))
    said: dict[str, str] = {}

    def told() -> bool:
        for e in workloads.core.list_namespaced_event("default", field_selector="reason=FailedScheduling").items:
            said[e.involved_object.name] = e.message
        return {"lost", "stranger"} <= said.keys()

    poll("the refusals' events", told, 30)
    assert said["lost"] == "no gpupool project: label the pod or its namespace gpupool.io/project=<project>"
    assert said["stranger"] == "no gpupool project named 'nobody'"
    [cond] = [
        c for c in workloads.core.read_namespaced_pod("lost", "default").status.conditions if c.type == "PodScheduled"
    ]
    assert (cond.status, cond.reason, cond.message) == ("False", "Unschedulable", said["lost"])
    assert s.json("list") == []


def test_fractions_share_one_device_and_a_pod_another_scheduler_placed_takes_room(
    cluster: Cluster, workloads: Workloads, kube_server: Callable[..., Server]
) -> None:
    s, node = start(cluster, kube_server, "share", gpus=4)
    daemon = pod("daemon", {}, gpus=2)
    daemon["spec"] |= {"schedulerName": "default-scheduler", "nodeName": node}
    workloads.core.create_namespaced_pod("default", daemon)
    wait_for(lambda: devices(s, node) == [0, 1], 30, "2 GPUs left")
    for name in ("half-a", "half-b"):
        workloads.core.create_namespaced_pod(
            "default", pod(name, {PROJECT: "vision"}, gpus=0, **{"gpupool.io/gpu-fraction": "0.5"})
        )
    halves = workloads.wait_pods(f"{PROJECT}=vision", 2, "Running")
    notes = [p.metadata.annotations for p in halves]
    assert notes[0]["gpupool.io/devices"] == notes[1]["gpupool.io/devices"] == "0:500"
    assert notes[0]["gpupool.io/visible-devices"] == f"GPU-{node}-0"
    held = client.CoreV1Api(cluster.api()).list_namespaced_pod(
        "gpupool-system", label_selector="gpupool.io/reservation=true"
    )
    assert [(p.spec.node_name, p.metadata.labels["gpupool.io/device"]) for p in held.items] == [(node, "0")]
    # The daemon's 2 GPUs and the shared one leave one whole GPU: 2 wait, 1 runs.
    workloads.core.create_namespaced_pod("default", pod("two", {PROJECT: "vision"}, gpus=2))
    workloads.core.create_namespaced_pod("default", pod("one", {PROJECT: "vision"}, gpus=1))
    wait_for(lambda: states(s) == {"half-a": "running", "half-b": "running", "one": "running", "two": "pending"},
             30, "one to run and two to wait")  # fmt: skip
    assert s.workload("two")["reason_code"] == "no-node-fits"

    def waits() -> bool:  # its condition says why, in gpupool's words
        conds = workloads.core.read_namespaced_pod("two", "default").status.conditions or []
        return any(c.type == "PodScheduled" and c.message.startswith("no-node-fits: ") for c in conds)

    poll("two's condition to say why it waits", waits, 30)
    # Bound by someone else meanwhile: its workload ends, and its 2 GPUs count as in use. The node is over-committed
    # (4 GPUs of others' and gpupool's 2): gpupool offers only the devices it holds, and once "one" ends, not its.
    workloads.bind("two", node)
    w = s.wait_state("two", "cancelled", timeout=30)
    assert w["events"][-1]["args"] == {"by": f"kubernetes: bound to {node} by another scheduler"}
    s.cli("cancel", "one")
    wait_for(lambda: devices(s, node) == [0], 30, "only the shared device left")
    workloads.core.create_namespaced_pod("default", pod("three", {PROJECT: "vision"}, gpus=1))
    wait_for(lambda: states(s).get("three") == "pending" and s.workload("three")["reason_code"] == "no-node-fits", 30,
             "three to wait")  # fmt: skip
    assert states(s) == {"half-a": "running", "half-b": "running", "one": "cancelled", "two": "cancelled",
                         "three": "pending"}  # fmt: skip


def test_a_deleted_pod_ends_its_workload_and_a_jobs_pod_runs_to_completion(
    cluster: Cluster, workloads: Workloads, kube_server: Callable[..., Server]
) -> None:
    s, node = start(cluster, kube_server, "jobs")
    workloads.core.create_namespaced_pod("default", pod("doomed", {PROJECT: "vision"}))
    reach(s, "doomed", "running")
    # A pod that claims doomed's allocation (annotation and label forged) is not taken for it: it ends, doomed runs.
    alloc = workloads.core.read_namespaced_pod("doomed", "default").metadata.annotations["gpupool.io/allocation"]
    forged = pod("forged", {"gpupool.io/managed": "true"}, gpus=0, run_for="1s", **{"gpupool.io/allocation": alloc})
    forged["spec"]["nodeName"] = node
    workloads.core.create_namespaced_pod("default", forged)
    workloads.wait_pods("gpupool.io/managed=true", 1, "Succeeded")
    workloads.core.delete_namespaced_pod("forged", "default", grace_period_seconds=0)
    poll("the forged pod gone", lambda: not workloads.pods("gpupool.io/managed=true"), 30)
    assert s.workload("doomed")["state"] == "running"
    workloads.core.delete_namespaced_pod("doomed", "default")
    w = s.wait_state("doomed", "cancelled", timeout=30)
    assert w["events"][-1]["args"] == {"by": "kubernetes"}
    # Cancelled through gpupool, the pod is deleted (with its grace period) and the workload ends cancelled.
    workloads.core.create_namespaced_pod("default", pod("stopped", {PROJECT: "vision"}))
    reach(s, "stopped", "running")
    s.cli("cancel", "stopped")
    s.wait_state("stopped", "cancelled", timeout=30)
    poll(
        "the cancelled pod gone",
        lambda: not [p for p in workloads.pods(f"{PROJECT}=vision") if p.metadata.name == "stopped"],
        30,
    )
    job = indexed_job("train", 2, scheduler="gpupool", run_for="2s")
    job["spec"]["template"]["metadata"]["labels"][PROJECT] = "vision"
    workloads.create_job(job)
    poll("the Job to complete", lambda: workloads.job_condition("train", "Complete"), 60, cluster.logs)
    # Its 2 pods were one gang: one workload of 2 members.
    w = s.wait_state("train", "succeeded", timeout=30)
    assert (w["workers"], w["origin"]["kind"]) == (2, "Job")
