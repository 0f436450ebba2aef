"""Project volumes on Kubernetes: a PersistentVolumeClaim in the project's namespace, of the volume's size, named
by the volume's id (deterministic, so a launch retried, or of a gang's every member, makes it once: 409 is done),
made at the first launch that mounts it and deleted with the volume. The cluster's default StorageClass provides
it; ReadWriteOnce, so the members that share it are those its volume binding lets share (one node, usually)."""

from __future__ import annotations

from typing import Any

from gpupool.backends.base import LaunchSpec, VolumeSpec

MANAGED = "app.kubernetes.io/managed-by"


def claim_name(volume: VolumeSpec) -> str:
    return f"gpupool-vol-{volume.volume_id}"


def claim_manifest(volume: VolumeSpec, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": claim_name(volume),
            "namespace": namespace,
            "labels": {MANAGED: "gpupool", "gpupool.io/volume": volume.name},
        },
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": str(volume.size_bytes)}}},
    }


def pod_volumes(spec: LaunchSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's volumes and the main container's mounts for the member's project volumes."""
    volumes = [{"name": f"vol-{v.volume_id}", "persistentVolumeClaim": {"claimName": claim_name(v)}}
               for v in spec.volumes]  # fmt: skip
    mounts = [{"name": f"vol-{v.volume_id}", "mountPath": v.path, "readOnly": v.read_only} for v in spec.volumes]
    return volumes, mounts
