"""A project's secrets reach its pods from a Secret in its namespace, never spelled out in the pod spec."""

from __future__ import annotations

from gpupool.backends.base import LaunchSpec
from gpupool.backends.kubernetes.backend import KubernetesBackend
from kubernetes import client
from tests.e2e.conftest import wait_for
from tests.kubernetes.cluster import Cluster


def _spec(alloc: str, secrets: dict[str, str]) -> LaunchSpec:
    return LaunchSpec(
        alloc_id=alloc, workload_id=int(alloc.split("-")[0]), workload_name=f"w{alloc}", project="vault",
        kind="batch", argv=("sleep", "inf"), env={"OWN": "workload"}, node="nowhere", project_id=4,
        secrets=secrets,
    )  # fmt: skip


def test_secrets_live_in_the_projects_secret_and_pods_take_them_from_there(
    cluster: Cluster, backend: KubernetesBackend
) -> None:
    core = client.CoreV1Api(cluster.api())
    backend.launch(_spec("1-0-0", {"API_KEY": "first", "DB_PASSWORD": "hunter2"}))
    pod = wait_for(lambda: core.list_namespaced_pod("gpupool-vault").items, 30, "the pod")[0]
    stored = cluster.api().sanitize_for_serialization(pod)["spec"]["containers"][0]
    assert stored["envFrom"] == [{"secretRef": {"name": "gpupool-project-secrets"}}]
    assert "hunter2" not in str(cluster.api().sanitize_for_serialization(pod))
    secret = core.read_namespaced_secret("gpupool-project-secrets", "gpupool-vault")
    assert sorted(secret.data) == ["API_KEY", "DB_PASSWORD"]
    # A later launch carries the values as they are now.
    backend.launch(_spec("2-0-0", {"API_KEY": "second"}))
    secret = core.read_namespaced_secret("gpupool-project-secrets", "gpupool-vault")
    assert sorted(secret.data) == ["API_KEY"]
    assert secret.data["API_KEY"] == "c2Vjb25k"  # base64 of "second"
