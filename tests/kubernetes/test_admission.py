"""Suspend-based admission, as Kueue's: a Job or JobSet created suspended with a gpupool project makes no pod until
its whole gang fits; gpupool then unsuspends it and binds the pods its controller makes where the gang was placed.
Real kube-apiserver, kwok, kube-controller-manager (Jobs) and JobSet's manager."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.e2e.conftest import Server, wait_for
from tests.kubernetes.cluster import Cluster
from tests.kubernetes.controllers import JOBSET_GROUP, JOBSET_VERSION, JOBSETS, JobSetManager, Workloads, jobset, poll
from tests.kubernetes.test_foreign_pods import PROJECT, reach, start
from tests.kubernetes.test_gangs import JOB, gpupool_job, start_with_one_held


def suspended_job(name: str, pods: int, project: str, run_for: str = "", priority: str = "") -> dict[str, Any]:
    job = gpupool_job(name, pods, project, run_for=run_for, priority=priority)
    job["metadata"]["labels"] = {PROJECT: project}
    job["spec"]["suspend"] = True
    return job


def events(workloads: Workloads, name: str) -> list[tuple[str, str]]:
    """gpupool's events on the object (the Job controller writes its own)."""
    found = workloads.core.list_namespaced_event(workloads.namespace, field_selector=f"involvedObject.name={name}")
    ours = [e for e in found.items if e.source.component == "gpupool"]
    return [(e.reason, e.message) for e in sorted(ours, key=lambda e: e.metadata.creation_timestamp)]


def suspended(workloads: Workloads, job: str) -> bool:
    return bool(workloads.batch.read_namespaced_job(job, workloads.namespace).spec.suspend)


def test_a_suspended_job_makes_no_pod_until_its_whole_gang_fits(
    cluster: Cluster, workloads: Workloads, kube_server: Callable[..., Server]
) -> None:
    s, node = start_with_one_held(cluster, kube_server, workloads, "admit")
    workloads.create_job(suspended_job("held", 4, "vision", run_for="2s"))
    w = reach(s, "held", "pending")
    uid = workloads.batch.read_namespaced_job("held", "default").metadata.uid
    assert (w["workers"], w["gpus"], w["origin"]) == (4, 1, {
        "kind": "Job", "namespace": "default", "name": "held", "uid": uid, "pods": []})  # fmt: skip
    wait_for(lambda: s.workload("held")["reason_code"] == "gang-unplaceable", 30, "held to wait for room")
    assert suspended(workloads, "held") and workloads.pods(f"{JOB}=held") == []
    # A Job whose project does not exist stays suspended, and says why.
    workloads.create_job(suspended_job("stray", 1, "nobody"))
    refused = [("FailedAdmission", "no gpupool project named 'nobody'")]
    poll("the refusal", lambda: events(workloads, "stray") == refused, 30)
    assert suspended(workloads, "stray")

    # Room for the whole gang: the Job is unsuspended, its 4 pods bound where the gang was placed, and it completes.
    workloads.core.delete_namespaced_pod("holder", "default", grace_period_seconds=0)
    running = workloads.wait_pods(f"{JOB}=held", 4, "Running", timeout=60)
    assert {p.spec.node_name for p in running} == {node}
    assert sorted(p.metadata.annotations["gpupool.io/devices"] for p in running) == ["0:1000", "1:1000", "2:1000",
                                                                                      "3:1000"]  # fmt: skip
    poll("the Job complete", lambda: workloads.job_condition("held", "Complete"), 60, cluster.logs)
    done = s.wait_state("held", "succeeded", timeout=30)
    assert done["id"] == w["id"] and sorted(done["origin"]["pods"]) == sorted(p.metadata.name for p in running)
    assert [r for r, _ in events(workloads, "held")] == ["Admitted"]


def test_a_jobset_is_admitted_whole_and_suspended_again_when_preempted(
    cluster: Cluster, jobset_controller: JobSetManager, workloads: Workloads, kube_server: Callable[..., Server]
) -> None:
    s, node = start(cluster, kube_server, "readmit", gpus=4)
    body = jobset("pair", {"leader": 1, "workers": 3}, scheduler="gpupool")
    body["metadata"]["labels"] = {PROJECT: "vision"}
    body["spec"]["suspend"] = True
    for rj in body["spec"]["replicatedJobs"]:
        rj["template"]["spec"]["template"]["metadata"]["labels"] |= {PROJECT: "vision", "gpupool.io/priority": "batch"}
    workloads.create_jobset(body)
    selector = "jobset.sigs.k8s.io/jobset-name=pair"
    running = workloads.wait_pods(selector, 4, "Running", timeout=60)
    assert {p.spec.node_name for p in running} == {node}
    w = reach(s, "pair", "running")
    assert (w["workers"], w["origin"]["kind"]) == (4, "JobSet")

    # A training Job of the same project preempts it: the JobSet is suspended again (its controller removes its
    # pods), and its workload waits in its old place, the same workload.
    workloads.create_job(gpupool_job("train", 2, "vision", run_for="4s"))
    workloads.wait_pods(f"{JOB}=train", 2, "Running", timeout=60)

    def suspended_again() -> bool:
        got = workloads.custom.get_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, "default", JOBSETS, "pair")
        return bool(got["spec"].get("suspend")) and not workloads.pods(selector)

    poll("the JobSet suspended, its pods gone", suspended_again, 60)
    again = s.workload("pair")
    assert (again["id"], again["state"]) == (w["id"], "preempted")
    # Once the Job is done the JobSet is admitted again, whole.
    poll("the Job complete", lambda: workloads.job_condition("train", "Complete"), 60, cluster.logs)
    back = workloads.wait_pods(selector, 4, "Running", timeout=60)
    assert {p.spec.node_name for p in back} == {node}
    assert s.wait_state("pair", "running", timeout=30)["id"] == w["id"]
