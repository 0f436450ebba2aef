"""The ecosystem's own controllers on the tests' cluster, before gpupool schedules anything for them: the Job
controller of kube-controller-manager and JobSet's manager create, suspend and replace pods as in a real cluster,
and kwok runs the pods a test binds. Pods name a scheduler nobody serves, so they wait until bound."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException

from tests.kubernetes.cluster import Cluster
from tests.kubernetes.controllers import (
    JOBSET_GROUP,
    JOBSET_VERSION,
    JOBSETS,
    JobSetManager,
    Workloads,
    indexed_job,
    jobset,
    poll,
)

NOBODY = "nobody-serves-this"
INDEX = "batch.kubernetes.io/job-completion-index"


def test_an_indexed_jobs_pods_wait_for_their_scheduler_then_run_once_bound(
    cluster: Cluster, workloads: Workloads
) -> None:
    workloads.create_job(indexed_job("train", 4, scheduler=NOBODY, run_for="1s"))
    pods = workloads.wait_pods("batch.kubernetes.io/job-name=train", 4, "Pending")
    assert sorted(p.metadata.annotations[INDEX] for p in pods) == ["0", "1", "2", "3"]
    assert [p.spec.node_name for p in pods] == [None] * 4
    assert {p.spec.scheduler_name for p in pods} == {NOBODY}

    (node,) = cluster.add_gpu_nodes(1)
    for p in pods:
        workloads.bind(p.metadata.name, node)
    poll("the Job complete", lambda: workloads.job_condition("train", "Complete"), logs=cluster.logs)
    done = workloads.batch.read_namespaced_job_status("train", workloads.namespace).status
    assert (done.succeeded, done.failed or 0) == (4, 0)


def test_a_suspended_job_creates_no_pod_until_resumed(cluster: Cluster, workloads: Workloads) -> None:
    workloads.create_job(indexed_job("held", 4, scheduler=NOBODY, suspend=True))
    poll("the Job marked Suspended", lambda: workloads.job_condition("held", "Suspended"), logs=cluster.logs)
    assert workloads.pods("batch.kubernetes.io/job-name=held") == []

    workloads.set_suspend("held", False)
    workloads.wait_pods("batch.kubernetes.io/job-name=held", 4, "Pending")


def test_a_deleted_pod_of_a_job_is_replaced(cluster: Cluster, workloads: Workloads) -> None:
    workloads.create_job(indexed_job("keep", 2, scheduler=NOBODY))
    before = workloads.wait_pods("batch.kubernetes.io/job-name=keep", 2)
    victim = next(p for p in before if p.metadata.annotations[INDEX] == "0")
    workloads.core.delete_namespaced_pod(victim.metadata.name, workloads.namespace, grace_period_seconds=0)

    def replaced() -> bool:
        pods = workloads.pods("batch.kubernetes.io/job-name=keep")
        return len(pods) == 2 and victim.metadata.uid not in {p.metadata.uid for p in pods}

    poll("index 0 recreated", replaced, logs=cluster.logs)
    after = workloads.pods("batch.kubernetes.io/job-name=keep")
    assert sorted(p.metadata.annotations[INDEX] for p in after) == ["0", "1"]


def test_a_jobset_creates_its_child_jobs_and_their_pods(
    cluster: Cluster, jobset_controller: JobSetManager, workloads: Workloads
) -> None:
    workloads.create_jobset(jobset("pair", {"leader": 1, "workers": 3}, scheduler=NOBODY))
    selector = "jobset.sigs.k8s.io/jobset-name=pair"
    pods = workloads.wait_pods(selector, 4, "Pending")
    jobs = workloads.batch.list_namespaced_job(workloads.namespace, label_selector=selector).items
    assert sorted(j.metadata.name for j in jobs) == ["pair-leader-0", "pair-workers-0"]
    assert sorted(p.metadata.labels["batch.kubernetes.io/job-name"] for p in pods) == [
        "pair-leader-0",
        *["pair-workers-0"] * 3,
    ]
    # The release's webhooks are in the path: defaulting filled the success policy ...
    stored = workloads.custom.get_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, "default", JOBSETS, "pair")
    assert stored["spec"]["successPolicy"]["operator"] == "All"
    # ... and validation refuses a success policy naming a replicated job the JobSet lacks.
    bad = jobset("bad", {"workers": 1}, scheduler=NOBODY)
    bad["spec"]["successPolicy"] = {"operator": "All", "targetReplicatedJobs": ["leader"]}
    with pytest.raises(ApiException) as refused:
        workloads.create_jobset(bad)
    assert refused.value.status == 403
    assert "vjobset.kb.io" in str(refused.value.body)
