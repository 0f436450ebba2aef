"""Which gang a pod gpupool did not make belongs to, from the conventions the ecosystem already uses: a PodGroup
(`scheduling.x-k8s.io/pod-group` label, its `minMember`), or the pod's controller: a batch/v1 Job that runs several
pods at once, the JobSet over such Jobs, a Kubeflow training job (PyTorchJob, TFJob, MPIJob, ...: its
`*ReplicaSpecs`), a KubeRay RayCluster (its worker groups).

A gang's members are the pods that ask for GPUs; the size is counted from the owner's spec the same way (replicas of
the templates that ask for GPUs), so a CPU-only launcher, JobSet leader or Ray head is placed on its own and never
holds the gang back. Owners are read through the API and kept for a while: a burst of one Job's pods costs one read.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from gpupool.backends.kubernetes.foreign import GPU_FRACTION, GPU_MEMORY, ForeignPod, Gang, Owner, requests_of
from gpupool.backends.kubernetes.manifests import quantity

log = logging.getLogger("gpupool.kubernetes")
KEEP_S = 30.0
"""How long what an owner says is trusted before it is read again."""
RETRY_S = 5.0
"""How soon an owner found missing is looked for again (a PodGroup may be made after its pods)."""
PLURALS = {
    ("jobset.x-k8s.io", "JobSet"): "jobsets",
    ("kubeflow.org", "PyTorchJob"): "pytorchjobs",
    ("kubeflow.org", "TFJob"): "tfjobs",
    ("kubeflow.org", "MPIJob"): "mpijobs",
    ("kubeflow.org", "XGBoostJob"): "xgboostjobs",
    ("kubeflow.org", "PaddleJob"): "paddlejobs",
    ("kubeflow.org", "JAXJob"): "jaxjobs",
    ("ray.io", "RayCluster"): "rayclusters",
    ("scheduling.x-k8s.io", "PodGroup"): "podgroups",
}


class Unreadable(Exception):
    """An owner that decides a pod's gang could not be read: the pod waits rather than run outside its gang."""


def asks_gpu(template: Mapping[str, Any]) -> bool:
    """Whether a pod template asks for GPUs: whole ones, or a share by gpupool's annotations."""
    notes = (template.get("metadata") or {}).get("annotations") or {}
    return requests_of(template.get("spec") or {}, quantity)[0] > 0 or GPU_FRACTION in notes or GPU_MEMORY in notes


def job_size(job: Mapping[str, Any]) -> int:
    """The pods a Job runs at once: its parallelism (1 if unset), no more than its completions."""
    spec = job.get("spec") or {}
    parallelism = int(spec.get("parallelism", 1) if spec.get("parallelism") is not None else 1)
    completions = spec.get("completions")
    return min(parallelism, int(completions)) if completions is not None else parallelism


def jobset_size(jobset: Mapping[str, Any]) -> int:
    total = 0
    for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        job = (rj.get("template") or {}) or {}
        if asks_gpu((job.get("spec") or {}).get("template") or {}):
            total += int(rj.get("replicas", 1)) * job_size(job)
    return total


def replicas_size(obj: Mapping[str, Any]) -> int:
    """A Kubeflow training job: the replicas of its replica specs (Master, Worker, Launcher ...) that ask GPUs."""
    spec = obj.get("spec") or {}
    total = 0
    for key, replicas in spec.items():
        if key.endswith("ReplicaSpecs") and isinstance(replicas, dict):
            for r in replicas.values():
                if asks_gpu(r.get("template") or {}):
                    total += int(r.get("replicas", 1))
    return total


def raycluster_size(cluster: Mapping[str, Any]) -> int:
    spec = cluster.get("spec") or {}
    total = 1 if asks_gpu((spec.get("headGroupSpec") or {}).get("template") or {}) else 0
    for group in spec.get("workerGroupSpecs") or []:
        if asks_gpu(group.get("template") or {}):
            replicas = group.get("replicas", group.get("minReplicas", 1))
            total += int(replicas) * int(group.get("numOfHosts", 1))
    return total


def _group(api_version: str) -> str:
    return api_version.split("/", 1)[0] if "/" in api_version else ""


class GangReader:
    """Reads owners (cached) to find each pod's gang."""

    def __init__(self, api_client: Any, client: Any) -> None:
        self._client = client
        self._batch = client.BatchV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._lock = threading.Lock()
        self._kept: dict[tuple[str, str, str], tuple[dict[str, Any] | None, float]] = {}
        """(kind, namespace, name) → the object (None: gone) and until when it is trusted."""

    def gang(self, pod: ForeignPod) -> Gang | None:
        """The pod's gang, or None where it is placed on its own (no gang, a gang of one, or it asks no GPU).
        Raises Unreadable where an owner that decides it could not be read."""
        if not pod.asks_gpu:
            return None
        if pod.pod_group:
            group = self._read("scheduling.x-k8s.io/v1alpha1", "PodGroup", pod.namespace, pod.pod_group)
            if group is None:
                raise Unreadable(f"PodGroup {pod.namespace}/{pod.pod_group} does not exist")
            size = int((group.get("spec") or {}).get("minMember", 1))
            return self._made(group, "PodGroup", pod.namespace, size)
        owner = pod.owner
        if owner is None:
            return None
        obj = self._read(owner.api_version, owner.kind, pod.namespace, owner.name, owner.uid)
        if obj is None:
            return None  # gone: its pods go with it
        if owner.kind == "Job" and _group(owner.api_version) == "batch":
            parent = _controller(obj)
            if parent is not None and parent.kind == "JobSet":
                jobset = self._read(parent.api_version, "JobSet", pod.namespace, parent.name, parent.uid)
                return None if jobset is None else self._made(jobset, "JobSet", pod.namespace, jobset_size(jobset))
            return self._made(obj, "Job", pod.namespace, job_size(obj))
        if owner.kind == "RayCluster":
            return self._made(obj, owner.kind, pod.namespace, raycluster_size(obj))
        if _group(owner.api_version) == "kubeflow.org":
            return self._made(obj, owner.kind, pod.namespace, replicas_size(obj))
        if owner.kind == "JobSet":
            return self._made(obj, owner.kind, pod.namespace, jobset_size(obj))
        return None

    @staticmethod
    def _made(obj: Mapping[str, Any], kind: str, namespace: str, size: int) -> Gang | None:
        meta = obj.get("metadata") or {}
        if size < 2:
            return None
        return Gang(kind, namespace, str(meta.get("name", "")), str(meta.get("uid", "")), size)

    def _read(self, api_version: str, kind: str, namespace: str, name: str, uid: str = "") -> dict[str, Any] | None:
        key = (kind, namespace, name)
        now = time.monotonic()
        with self._lock:
            kept = self._kept.get(key)
        if kept is not None and now < kept[1] and (kept[0] is None or not uid or _uid(kept[0]) == uid):
            return kept[0]
        try:
            obj = self._get(api_version, kind, namespace, name)
        except self._client.ApiException as e:
            if e.status == 404:
                obj = None
            else:
                reason = "forbidden: gpupool may not read it" if e.status == 403 else f"{e.status} {e.reason}"
                raise Unreadable(f"cannot read {kind} {namespace}/{name} ({reason})") from None
        except Exception as e:  # a dropped connection
            raise Unreadable(f"cannot read {kind} {namespace}/{name} ({type(e).__name__})") from None
        if obj is not None and uid and _uid(obj) != uid:
            obj = None  # a newer object of the same name: the pod's owner is gone
        with self._lock:
            if len(self._kept) > 10_000:
                self._kept = {k: v for k, v in self._kept.items() if v[1] > now}
            self._kept[key] = (obj, now + (KEEP_S if obj is not None else RETRY_S))
        return obj

    def _get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any]:
        group, _, version = api_version.rpartition("/")
        if kind == "Job" and group == "batch":
            raw = self._batch.read_namespaced_job(name, namespace, _preload_content=False)
            return dict(json.loads(raw.data))
        plural = PLURALS.get((group, kind))
        if plural is None:
            raise self._client.ApiException(status=404, reason=f"{kind} is not an owner gpupool reads")
        return dict(self._custom.get_namespaced_custom_object(group, version, namespace, plural, name))


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))


def _controller(obj: Mapping[str, Any]) -> Owner | None:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    ref = next((r for r in refs if r.get("controller")), None)
    if ref is None:
        return None
    return Owner(ref.get("apiVersion", ""), ref.get("kind", ""), ref.get("name", ""), ref.get("uid", ""))
