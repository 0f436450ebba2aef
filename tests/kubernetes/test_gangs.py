"""Gangs from the ecosystem's conventions: the pods of an indexed Job, a JobSet or a PodGroup are one gpupool
workload, placed all or nothing, preempted and reclaimed whole; their controllers make the pods again, which wait.
Real kube-apiserver, kwok, kube-controller-manager (Jobs) and JobSet's manager."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client
from tests.e2e.conftest import Server, wait_for
from tests.kubernetes.cluster import Cluster
from tests.kubernetes.controllers import JobSetManager, Workloads, indexed_job, jobset, poll
from tests.kubernetes.test_foreign_pods import PROJECT, pod, start

JOB = "batch.kubernetes.io/job-name"
INDEX = "batch.kubernetes.io/job-completion-index"


def gpupool_job(
    name: str, pods: int, project: str, run_for: str = "", priority: str = "", gpus: int = 1
) -> dict[str, Any]:
    """An indexed Job of `pods` pods of `gpus` GPUs that name gpupool, whose pods preempted by gpupool count as no
    failure. (The Job controller still waits its backoff before it replaces them: 10 s, doubled per pod.)"""
    job = indexed_job(name, pods, scheduler="gpupool", run_for=run_for)
    job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = str(gpus)
    job["spec"]["podFailurePolicy"] = {
        "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
    }
    labels = job["spec"]["template"]["metadata"]["labels"]
    labels[PROJECT] = project
    if priority:
        labels["gpupool.io/priority"] = priority
    return job


def said(workloads: Workloads, name: str) -> str:
    """What a pod's PodScheduled condition says ("" if none)."""
    conds = workloads.core.read_namespaced_pod(name, workloads.namespace).status.conditions or []
    return next((c.message for c in conds if c.type == "PodScheduled" and c.status == "False"), "")


def of(s: Server, project: str, origin: str) -> list[dict[str, Any]]:
    """The project's workloads made from the Job (JobSet ...) named `origin`, oldest first."""
    described = sorted((s.workload(str(w["id"])) for w in s.json("list", "-p", project, "--all-runs")),
                       key=lambda w: w["id"])
    return [w for w in described if (w.get("origin") or {}).get("name") == origin]


def stops(w: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [(e["code"], e["reason_code"]) for e in w["events"] if e["reason_code"] is not None]


def start_with_one_held(cluster: Cluster, kube_server: Callable[..., Server], workloads: Workloads,
                        prefix: str) -> tuple[Server, str]:  # fmt: skip
    """A node of 4 GPUs, one of them taken by a running pod named holder (delete it to make room)."""
    s, node = start(cluster, kube_server, prefix, gpus=4)
    workloads.core.create_namespaced_pod("default", pod("holder", {PROJECT: "vision"}))
    workloads.wait_pods(f"{PROJECT}=vision", 1, "Running")
    return s, node


def test_an_indexed_job_is_one_gang_placed_all_or_nothing(
    cluster: Cluster, workloads: Workloads, kube_server: Callable[..., Server]
) -> None:
    s, node = start_with_one_held(cluster, kube_server, workloads, "gang")
    # 3 GPUs are free and the Job's 4 pods ask one each: none is bound, rather than 3 that could not start.
    workloads.create_job(gpupool_job("train", 4, "vision", run_for="3s"))
    pods = workloads.wait_pods(f"{JOB}=train", 4)
    [w] = wait_for(lambda: of(s, "vision", "train") or None, 30, "the gang's workload")
    assert (w["name"], w["workers"], w["gpus"], w["state"]) == ("train", 4, 1, "pending")
    uid = workloads.batch.read_namespaced_job("train", "default").metadata.uid
    ranked = [p.metadata.name for p in sorted(pods, key=lambda p: int(p.metadata.annotations[INDEX]))]
    assert w["origin"] == {"kind": "Job", "namespace": "default", "name": "train", "uid": uid, "pods": ranked}
    assert f"Pods:        {', '.join(ranked)}\n" in s.cli("describe", "train").stdout

    def all_told() -> bool:
        return all(said(workloads, p.metadata.name).startswith("gang-unplaceable: gang of 4 members") for p in pods)

    poll("each pod to say why it waits", all_told, 30,
         lambda: f"{[said(workloads, p.metadata.name) for p in pods]} {s.workload('train')}")  # fmt: skip
    assert [p.spec.node_name for p in workloads.pods(f"{JOB}=train")] == [None] * 4
    # Room for all four: all are bound at once, and the Job completes.
    workloads.core.delete_namespaced_pod("holder", "default", grace_period_seconds=0)
    running = workloads.wait_pods(f"{JOB}=train", 4, "Running")
    assert {p.spec.node_name for p in running} == {node}
    devices = sorted(p.metadata.annotations["gpupool.io/devices"] for p in running)
    assert devices == ["0:1000", "1:1000", "2:1000", "3:1000"]
    poll("the Job complete", lambda: workloads.job_condition("train", "Complete"), 60, cluster.logs)
    assert s.wait_state("train", "succeeded", timeout=30)["workers"] == 4
    assert [w["state"] for w in of(s, "vision", "train")] == ["succeeded"]


def test_a_podgroup_waits_for_its_pods_with_a_reason_then_a_timeout(
    cluster: Cluster, workloads: Workloads, kube_server: Callable[..., Server]
) -> None:
    api = cluster.api()
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "podgroups.scheduling.x-k8s.io"},
        "spec": {
            "group": "scheduling.x-k8s.io",
            "scope": "Namespaced",
            "names": {"plural": "podgroups", "singular": "podgroup", "kind": "PodGroup"},
            "versions": [{"name": "v1alpha1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}],
        },
    }  # fmt: skip
    ext = client.ApiextensionsV1Api(api)
    if not ext.list_custom_resource_definition(field_selector="metadata.name=podgroups.scheduling.x-k8s.io").items:
        ext.create_custom_resource_definition(crd)
    custom = client.CustomObjectsApi(api)
    body = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "trio"},
            "spec": {"minMember": 3}}  # fmt: skip
    poll("the PodGroup kind served", lambda: _created(custom, body), 30)
    s, node = start(cluster, kube_server, "group", gpus=4)
    s.kill()
    s.env["GPUPOOL_GANG_TIMEOUT_S"] = "3"
    s.start()
    member = {PROJECT: "vision", "scheduling.x-k8s.io/pod-group": "trio"}
    for name in ("trio-a", "trio-b"):
        workloads.core.create_namespaced_pod("default", pod(name, member))
    incomplete = "gang-incomplete: 2 of 3 pods of PodGroup default/trio exist; gpupool places them together once all do"
    poll("the pods to say the gang is incomplete", lambda: said(workloads, "trio-a") == incomplete, 30)
    overdue = ("gang-timeout: only 2 of 3 pods of PodGroup default/trio exist after 3s; gpupool places none until "
               "all do (its controller may be short of quota, or failing to make pods)")  # fmt: skip
    poll("the gang overdue", lambda: said(workloads, "trio-b") == overdue, 30)
    assert s.json("list", "-p", "vision") == []
    workloads.core.create_namespaced_pod("default", pod("trio-c", member))
    running = workloads.wait_pods("scheduling.x-k8s.io/pod-group=trio", 3, "Running")
    assert {p.spec.node_name for p in running} == {node}
    w = s.workload("trio")
    assert (w["workers"], w["origin"]["kind"], w["state"]) == (3, "PodGroup", "running")
    custom.delete_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", "default", "podgroups", "trio")


def _created(custom: Any, body: dict[str, Any]) -> bool:
    try:
        custom.create_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", "default", "podgroups", body)
        return True
    except client.ApiException as e:
        return e.status == 409


def test_a_jobset_is_admitted_whole_or_not_at_all(
    cluster: Cluster, jobset_controller: JobSetManager, workloads: Workloads, kube_server: Callable[..., Server]
) -> None:
    s, node = start_with_one_held(cluster, kube_server, workloads, "set")
    body = jobset("pair", {"leader": 1, "workers": 3}, scheduler="gpupool")
    for rj in body["spec"]["replicatedJobs"]:
        rj["template"]["spec"]["template"]["metadata"]["labels"][PROJECT] = "vision"
    workloads.create_jobset(body)
    selector = "jobset.sigs.k8s.io/jobset-name=pair"
    workloads.wait_pods(selector, 4)
    w = wait_for(lambda: (of(s, "vision", "pair") or [None])[0], 30, "the JobSet's workload")
    assert (w["workers"], w["origin"]["kind"], w["state"]) == (4, "JobSet", "pending")
    leader = workloads.pods(selector)[0].metadata.name
    poll(
        "the leader to say why it waits",
        lambda: said(workloads, leader).startswith("gang-unplaceable: gang of 4 members"),
        30,
    )
    assert [p.spec.node_name for p in workloads.pods(selector)] == [None] * 4
    workloads.core.delete_namespaced_pod("holder", "default", grace_period_seconds=0)
    running = workloads.wait_pods(selector, 4, "Running")
    assert {p.spec.node_name for p in running} == {node}
    assert s.workload("pair")["state"] == "running"


def test_a_higher_priority_job_preempts_a_gang_whole_and_a_borrowed_gang_is_reclaimed_whole(
    cluster: Cluster, workloads: Workloads, kube_server: Callable[..., Server]
) -> None:
    s, node = start(cluster, kube_server, "preempt", gpus=4)
    workloads.create_job(gpupool_job("sweep", 2, "vision", priority="batch", gpus=2))
    first = workloads.wait_pods(f"{JOB}=sweep", 2, "Running")
    workloads.create_job(gpupool_job("train", 2, "vision", run_for="600s"))
    # The whole gang goes, though the newcomer needs only 2 of its 4 GPUs ...
    running = workloads.wait_pods(f"{JOB}=train", 2, "Running", timeout=60)
    assert {p.spec.node_name for p in running} == {node}
    replaced(workloads, "sweep", first)
    old, new = gangs(s, "vision", "sweep", 2)
    assert old["state"] == "cancelled"
    assert stops(old)[0] == ("stop-requested", "preempt")
    # ... and the Job controller's new pods are a new gang, which waits: 2 GPUs are free, it asks 4.
    assert (new["state"], new["workers"], new["gpus"]) == ("pending", 2, 2)
    assert [p.spec.node_name for p in workloads.pods(f"{JOB}=sweep")] == [None, None]

    # Reclaim: a project with no quota of its own borrows the whole node; the owner's Job takes it back, whole.
    for job in ("sweep", "train"):
        workloads.batch.delete_namespaced_job(job, "default", propagation_policy="Background")
    poll("the Jobs' pods gone", lambda: not workloads.pods(f"{PROJECT}=vision"), 60)
    s.cli("project", "create", "guest", "--deserved-gpus", "0", "--pool", "h100")
    workloads.create_job(gpupool_job("borrow", 2, "guest", priority="batch", gpus=2))
    borrowed = workloads.wait_pods(f"{JOB}=borrow", 2, "Running")
    workloads.create_job(gpupool_job("owner", 2, "vision", run_for="600s"))
    workloads.wait_pods(f"{JOB}=owner", 2, "Running", timeout=60)
    replaced(workloads, "borrow", borrowed)
    reclaimed, again = gangs(s, "guest", "borrow", 2)
    assert stops(reclaimed)[0] == ("stop-requested", "reclaim")
    assert (again["state"], again["workers"]) == ("pending", 2)
    assert [p.spec.node_name for p in workloads.pods(f"{JOB}=borrow")] == [None, None]


def replaced(workloads: Workloads, job: str, before: list[Any]) -> None:
    """Wait for the Job controller to have made new pods for all of `before` (after its backoff)."""
    gone = {p.metadata.uid for p in before}

    def made() -> bool:
        now = workloads.pods(f"{JOB}={job}")
        return len(now) == len(before) and not gone & {p.metadata.uid for p in now}

    poll(f"{job}'s pods replaced", made, 90)


def gangs(s: Server, project: str, origin: str, count: int) -> list[dict[str, Any]]:
    def found() -> list[dict[str, Any]] | None:
        got = of(s, project, origin)
        return got if len(got) == count and got[0]["state"] == "cancelled" else None

    return list(wait_for(found, 30, f"{count} workloads of {origin}, the first cancelled"))


def test_a_pod_gpupool_stops_says_so_before_it_goes(
    cluster: Cluster, workloads: Workloads, kube_server: Callable[..., Server]
) -> None:
    s, _ = start(cluster, kube_server, "stop", gpus=1)
    held = pod("held", {PROJECT: "vision"})
    held["metadata"]["finalizers"] = ["gpupool.test/hold"]  # kept after its deletion, to be read
    workloads.core.create_namespaced_pod("default", held)
    workloads.wait_pods(f"{PROJECT}=vision", 1, "Running")
    s.cli("cancel", "held")

    def disrupted() -> bool:
        got = workloads.core.read_namespaced_pod("held", "default")
        conds = [c for c in got.status.conditions or [] if c.type == "DisruptionTarget"]
        return got.metadata.deletion_timestamp is not None and bool(conds)

    poll("the pod marked and deleted", disrupted, 30)
    [c] = [c for c in workloads.core.read_namespaced_pod("held", "default").status.conditions
           if c.type == "DisruptionTarget"]  # fmt: skip
    assert (c.status, c.reason, c.message) == ("True", "PreemptionByScheduler", "gpupool: stopped by gpupool")
    workloads.core.patch_namespaced_pod("held", "default", {"metadata": {"finalizers": None}})
