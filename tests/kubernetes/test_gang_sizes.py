"""How big a gang is, read from its owner's spec, and where each pod ranks in it: pods and owners alone."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpupool.backends.kubernetes.foreign import foreign_pod
from gpupool.backends.kubernetes.gangs import job_size, jobset_size, raycluster_size, replicas_size
from gpupool.backends.kubernetes.manifests import quantity
from gpupool.control.foreign import gang_request


def template(gpus: int = 0, **notes: str) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {"metadata": {"annotations": notes},
            "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]}}  # fmt: skip


def test_a_job_runs_its_parallelism_at_once_never_more_than_its_completions() -> None:
    assert job_size({"spec": {"parallelism": 4, "completions": 4}}) == 4
    assert job_size({"spec": {"parallelism": 4, "completions": 2}}) == 2
    assert job_size({"spec": {"parallelism": 4}}) == 4
    assert job_size({"spec": {}}) == 1


def test_only_the_templates_that_ask_for_gpus_count_towards_a_gang() -> None:
    js = {"spec": {"replicatedJobs": [
        {"name": "leader", "replicas": 1, "template": {"spec": {"parallelism": 1, "template": template()}}},
        {"name": "workers", "replicas": 2, "template": {"spec": {"parallelism": 4, "completions": 4,
                                                                 "template": template(gpus=8)}}},
    ]}}  # fmt: skip
    assert jobset_size(js) == 8
    pytorch = {"spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": template(gpus=1)},
                                                "Worker": {"replicas": 3, "template": template(gpus=1)}}}}  # fmt: skip
    assert replicas_size(pytorch) == 4
    mpi = {"spec": {"mpiReplicaSpecs": {"Launcher": {"replicas": 1, "template": template()},
                                        "Worker": {"replicas": 2, "template": template(gpus=2)}}}}  # fmt: skip
    assert replicas_size(mpi) == 2
    half = template(**{"gpupool.io/gpu-fraction": "0.5"})
    ray = {"spec": {"headGroupSpec": {"template": template()}, "workerGroupSpecs": [
        {"groupName": "gpu", "replicas": 3, "template": template(gpus=1)},
        {"groupName": "tpu-like", "replicas": 2, "numOfHosts": 2, "template": half},
        {"groupName": "cpu", "replicas": 5, "template": template()},
    ]}}  # fmt: skip
    assert raycluster_size(ray) == 7


def pod(name: str, labels: dict[str, str], notes: dict[str, str], gpus: int = 1, cpu: str = "1") -> Any:
    meta = {
        "uid": f"uid-{name}",
        "namespace": "ml",
        "name": name,
        "labels": labels,
        "annotations": notes,
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "j1", "controller": True}],
    }
    container = {"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"cpu": cpu}}}
    return foreign_pod({"metadata": meta, "spec": {"containers": [container]}}, quantity)  # fmt: skip


def test_a_pod_ranks_by_its_operators_labels_then_its_name() -> None:
    index = "batch.kubernetes.io/job-completion-index"
    pods = [
        pod("w-1", {"jobset.sigs.k8s.io/replicatedjob-name": "workers", "jobset.sigs.k8s.io/job-index": "1"},
            {index: "0"}),
        pod("w-0b", {"jobset.sigs.k8s.io/replicatedjob-name": "workers", "jobset.sigs.k8s.io/job-index": "0"},
            {index: "10"}),
        pod("w-0a", {"jobset.sigs.k8s.io/replicatedjob-name": "workers", "jobset.sigs.k8s.io/job-index": "0"},
            {index: "2"}),
        pod("l-0", {"jobset.sigs.k8s.io/replicatedjob-name": "leader", "jobset.sigs.k8s.io/job-index": "0"},
            {index: "0"}),
    ]  # fmt: skip
    assert [p.name for p in sorted(pods, key=lambda p: p.rank)] == ["l-0", "w-0a", "w-0b", "w-1"]
    assert pods[0].owner is not None and (pods[0].owner.kind, pods[0].owner.uid) == ("Job", "j1")


def test_a_gangs_members_ask_the_same_gpus_and_each_the_most_cpu_any_asks() -> None:
    a, b = pod("a", {}, {}, cpu="1"), pod("b", {}, {}, cpu="4")
    a, b = replace(a, project="vision"), replace(b, project="vision")
    assert gang_request([a, b]) == (4000, 0)
    assert gang_request([a, replace(b, gpus=2)]) == (
        "pods a and b of one gang ask for different GPUs: gpupool places a gang whose pods ask the same "
        "(give a pod that differs a gang of its own)"
    )
    assert gang_request([a, replace(b, project="other")]) == "pods a and b of one gang name different gpupool projects"
