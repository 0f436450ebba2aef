"""A project volume on Kubernetes is a PersistentVolumeClaim of its size in the project's namespace, made once by
the first launch that mounts it (a second launch finds it: 409 is done), mounted into every member's pod, and
deleted with the volume."""

from __future__ import annotations

from gpupool.backends.base import LaunchSpec, VolumeSpec
from gpupool.backends.kubernetes.backend import KubernetesBackend
from gpupool.backends.kubernetes.manifests import CODE_DIR
from gpupool.services.volumes import POD_WORKDIR
from kubernetes import client
from tests.e2e.conftest import wait_for
from tests.kubernetes.cluster import Cluster

DATA = VolumeSpec(volume_id=7, project="store", name="data", path="/data", size_bytes=16 * 2**30)


def _spec(alloc: str, rank: int) -> LaunchSpec:
    return LaunchSpec(
        alloc_id=alloc, workload_id=int(alloc.split("-")[0]), workload_name=f"w{alloc}", project="store",
        kind="training", argv=("sleep", "inf"), env={}, node="nowhere", project_id=5, rank=rank, world_size=2,
        volumes=(DATA, VolumeSpec(8, "store", "ref", "/ref", 2**30, read_only=True)),
    )  # fmt: skip


def test_a_volume_is_a_claim_of_its_size_mounted_into_every_member(
    cluster: Cluster, backend: KubernetesBackend
) -> None:
    core = client.CoreV1Api(cluster.api())
    backend.launch(_spec("3-0-0", 0))
    backend.launch(_spec("3-0-1", 1))

    def pods() -> list[client.V1Pod] | None:
        found = [p for p in core.list_namespaced_pod("gpupool-store").items if p.metadata.name.startswith("w3")]
        return found if len(found) == 2 else None

    def live_claims() -> list[str]:
        items = core.list_namespaced_persistent_volume_claim("gpupool-store").items
        return sorted(c.metadata.name for c in items if c.metadata.deletion_timestamp is None)

    for pod in wait_for(pods, 30, "both pods"):
        spec = cluster.api().sanitize_for_serialization(pod)["spec"]
        claims = {
            v["name"]: v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v
        }
        assert claims == {"vol-7": "gpupool-vol-7", "vol-8": "gpupool-vol-8"}
        mounts = spec["containers"][0]["volumeMounts"]
        assert sorted((m["name"], m["mountPath"], m.get("readOnly", False)) for m in mounts) == [
            ("vol-7", "/data", False),
            ("vol-8", "/ref", True),
        ]
    claim = core.read_namespaced_persistent_volume_claim("gpupool-vol-7", "gpupool-store")
    assert claim.spec.resources.requests["storage"] == str(16 * 2**30)
    assert claim.spec.access_modes == ["ReadWriteOnce"]
    backend.delete_volume(DATA)
    backend.delete_volume(DATA)  # gone already: nothing to do
    wait_for(lambda: live_claims() == ["gpupool-vol-8"], 30, "the deleted volume's claim to go")


def test_submit_keeps_volumes_off_the_pods_working_directory() -> None:
    assert POD_WORKDIR == CODE_DIR
