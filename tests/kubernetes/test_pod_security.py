"""Pods confined by default, and the API server's Pod Security admission holding them to their namespace's level."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable
from typing import Any

import pytest

from gpupool.backends.base import LaunchSpec
from gpupool.backends.kubernetes.backend import KubernetesBackend
from gpupool.backends.kubernetes.manifests import pod_manifest
from kubernetes import client
from tests.e2e.conftest import Server, wait_for
from tests.kubernetes.cluster import Cluster

PSA = ("pod-security.kubernetes.io/enforce", "pod-security.kubernetes.io/enforce-version")


def _stored(cluster: Cluster, obj: Any) -> dict[str, Any]:
    """An object as the API server keeps it (camelCase JSON), not as the client's models spell it."""
    return dict(cluster.api().sanitize_for_serialization(obj))


def _labels(core: Any, namespace: str) -> dict[str, str]:
    labels = core.read_namespace(namespace).metadata.labels or {}
    return {k: labels[k] for k in PSA if k in labels}


def test_a_launched_pod_is_stored_restricted_in_a_namespace_that_enforces_restricted(
    cluster: Cluster, kube_server: Callable[..., Server]
) -> None:
    (node,) = cluster.add_gpu_nodes(1, prefix="psa")
    s = kube_server()
    wait_for(lambda: any(n["name"] == node and n["schedulable"] for n in s.json("nodes")), 30, "the node")
    s.cli("project", "create", "secure", "--deserved-gpus", "8", "--pool", "h100")
    with contextlib.closing(sqlite3.connect(s.data_dir / "gpupool.db")) as db:
        (project_id,) = db.execute("SELECT id FROM queues WHERE name = 'secure'").fetchone()
    s.cli("submit", "-p", "secure", "--name", "confined", "--gpus", "1", "--", "sleep", "inf")
    s.wait_state("confined", "running")
    core = client.CoreV1Api(cluster.api())
    (pod,) = core.list_namespaced_pod("gpupool-secure", label_selector="gpupool.io/workload=confined").items
    stored = _stored(cluster, pod)["spec"]
    uid = s.uid_base + project_id
    assert stored["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "fsGroup": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }  # fmt: skip
    assert stored["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": False,
    }
    host = {k: stored.get(k) for k in ("hostNetwork", "hostPID", "hostIPC", "volumes", "automountServiceAccountToken")}
    assert host == {"hostNetwork": None, "hostPID": None, "hostIPC": None, "volumes": None,
                    "automountServiceAccountToken": False}  # fmt: skip
    assert _labels(core, "gpupool-secure") == {PSA[0]: "restricted", PSA[1]: "latest"}
    # Its namespace takes connections from its own pods and the server's namespace only: not another project's.
    (policy,) = client.NetworkingV1Api(cluster.api()).list_namespaced_network_policy("gpupool-secure").items
    assert (policy.metadata.name, _stored(cluster, policy)["spec"]) == ("gpupool-project-isolation", {
        "podSelector": {},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [
            {"podSelector": {}},
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gpupool-system"}}},
        ]}],
    })  # fmt: skip
    s.cli("cancel", "confined")
    s.wait_state("confined", "cancelled", timeout=30)


def _spec(alloc: str, level: str) -> LaunchSpec:
    return LaunchSpec(
        alloc_id=alloc, workload_id=int(alloc.split("-")[0]), workload_name=f"w{alloc}", project="legacy",
        kind="batch", argv=("sleep", "inf"), env={}, node="nowhere", project_id=3, pod_security=level,
    )  # fmt: skip


def _refusal(core: Any, namespace: str, body: dict[str, Any]) -> tuple[int, str]:
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod(namespace, body, dry_run="All")
    return e.value.status, str(json.loads(e.value.body)["message"])


def test_the_api_server_holds_each_pod_to_its_projects_level_and_a_changed_level_relabels_the_namespace(
    cluster: Cluster, backend: KubernetesBackend
) -> None:
    core = client.CoreV1Api(cluster.api())
    backend.launch(_spec("41-0-0", "baseline"))
    assert _labels(core, "gpupool-legacy") == {PSA[0]: "baseline", PSA[1]: "latest"}
    pod = core.read_namespaced_pod("w41-0-0-41-0-0", "gpupool-legacy")
    assert _stored(cluster, pod)["spec"]["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    # Even at baseline the API server refuses what baseline forbids.
    escalated = pod_manifest(_spec("42-0-0", "baseline"), "gpupool-legacy", "img")
    escalated["spec"]["containers"][0]["securityContext"]["capabilities"] = {"add": ["SYS_ADMIN"]}
    escalated["spec"]["hostPID"] = True
    assert _refusal(core, "gpupool-legacy", escalated) == (
        403,
        'pods "w42-0-0-42-0-0" is forbidden: violates PodSecurity "baseline:latest": non-default capabilities '
        '(container "main" must not include "SYS_ADMIN" in securityContext.capabilities.add), '
        "host namespaces (hostPID=true)",
    )
    # The admin makes the project restricted: its namespace follows, and a baseline pod is no longer admitted.
    backend.launch(_spec("43-0-0", "restricted"))
    assert _labels(core, "gpupool-legacy") == {PSA[0]: "restricted", PSA[1]: "latest"}
    pod = core.read_namespaced_pod("w43-0-0-43-0-0", "gpupool-legacy")
    assert _stored(cluster, pod)["spec"]["securityContext"]["runAsUser"] == 1_900_000_003
    as_image_user = pod_manifest(_spec("44-0-0", "baseline"), "gpupool-legacy", "img")
    assert _refusal(core, "gpupool-legacy", as_image_user) == (
        403,
        'pods "w44-0-0-44-0-0" is forbidden: violates PodSecurity "restricted:latest": unrestricted capabilities '
        '(container "main" must set securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true '
        '(pod or container "main" must set securityContext.runAsNonRoot=true)',
    )
    # ...while the restricted rendering of the very same member is.
    core.create_namespaced_pod(
        "gpupool-legacy", pod_manifest(_spec("44-0-0", "restricted"), "gpupool-legacy", "img"), dry_run="All"
    )
