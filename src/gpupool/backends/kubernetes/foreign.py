"""Pods gpupool did not create, as the backend reads them: those that name gpupool as their scheduler (each may become
a workload) and those another scheduler placed on a node (capacity in use there)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

PROJECT = "gpupool.io/project"
"""The pod's (or its namespace's) label naming the gpupool project it runs under."""
PRIORITY = "gpupool.io/priority"
"""The pod's label naming one of gpupool's priority classes: it overrides what priorityClassName maps to."""
GPU_FRACTION = "gpupool.io/gpu-fraction"
"""A pod's annotation asking a fraction of one GPU (0 < f < 1), shared with other pods."""
GPU_MEMORY = "gpupool.io/gpu-memory"
"""A pod's annotation asking a share of one GPU by its memory ("20GiB")."""
VISIBLE_DEVICES = "gpupool.io/visible-devices"
"""Set on a bound fractional pod: the device it shares, as NVIDIA_VISIBLE_DEVICES names it. Its annotations are all
that may change once a pod exists, so a pod that wants it reads it through the downward API."""
GPU = "nvidia.com/gpu"
ALLOCATION = "gpupool.io/allocation"
POD_GROUP = "scheduling.x-k8s.io/pod-group"
"""The coscheduling convention's label naming a pod's PodGroup (whose minMember is the gang's size)."""
# Where a pod's rank in its gang is read from: the operators' own labels and annotations, most specific last.
_ROLE_KEYS = ("jobset.sigs.k8s.io/replicatedjob-name", "training.kubeflow.org/replica-type", "ray.io/group")
_JOB_KEYS = ("jobset.sigs.k8s.io/job-index",)
_INDEX_KEYS = ("batch.kubernetes.io/job-completion-index", "training.kubeflow.org/replica-index")
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B?)?", re.IGNORECASE | re.ASCII)
_SCALE_MIB = {"": 1.0, "K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0**2}


@dataclass(frozen=True, slots=True)
class Owner:
    """A pod's controller, as its ownerReferences name it."""

    api_version: str
    kind: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class Gang:
    """The group a pod is one member of, admitted all or nothing: a Job, a JobSet, an operator's job, a PodGroup."""

    kind: str
    namespace: str
    name: str
    uid: str
    size: int
    """How many of its pods ask for GPUs: the gang's members. Its pods that ask none are placed on their own."""


@dataclass(frozen=True, slots=True)
class ForeignPod:
    """A pod that names gpupool's scheduler and that gpupool did not make: what its workload is built from."""

    uid: str
    namespace: str
    name: str
    node: str
    """Where it is bound ("" until it is)."""
    phase: str
    deleting: bool
    project: str | None
    """Its label's, else its namespace's (filled by the backend, which reads namespaces)."""
    priority_class: str | None
    """The Kubernetes PriorityClass it names."""
    priority: str | None
    """gpupool's class from its label, which overrides priority_class."""
    gpus: int
    gpu_milli: int
    gpu_memory_mib: int
    cpu_milli: int
    memory_mib: int
    image: str | None
    grace_s: float
    error: str | None = None
    """Why its request cannot be read (a bad annotation): it is refused with this."""
    allocation: str | None = None
    """The allocation gpupool wrote on it before binding it; None on a pod gpupool has not bound."""
    owner: Owner | None = None
    pod_group: str | None = None
    """The PodGroup its label names."""
    rank: tuple[str, int, int, str] = ("", 0, 0, "")
    """Its place among its gang's pods: role (replicated job, replica type), job index, completion index, name."""
    gang: Gang | None = None
    """Filled by the backend, which reads owners: the gang it is a member of; None for a pod placed alone."""

    @property
    def asks_gpu(self) -> bool:
        return bool(self.gpus or self.gpu_milli or self.gpu_memory_mib)

    @property
    def ended(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class NodeUse:
    """What one pod another scheduler placed holds on its node."""

    node: str
    gpus: int
    cpu_milli: int
    memory_mib: int


Quantity = Callable[[object, int], int]
"""A Kubernetes quantity ("500m", "1Gi") in units of 1/scale."""


def requests_of(spec: Mapping[str, Any], quantity: Quantity) -> tuple[int, int, int]:
    """Whole GPUs (limits), CPU (milli) and memory (MiB) a pod asks, as the kubelet counts them: its containers'
    sum, or an init container's if that is more (they run one at a time, before the rest)."""

    def one(c: Mapping[str, Any]) -> tuple[int, int, int]:
        res = c.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        gpus = quantity(limits.get(GPU, requests.get(GPU, "0")), 1)
        cpu = quantity(requests.get("cpu", limits.get("cpu", "0")), 1000)
        memory = quantity(requests.get("memory", limits.get("memory", "0")), 1) // (1024 * 1024)
        return gpus, cpu, memory

    main = [one(c) for c in spec.get("containers") or []]
    total = tuple(sum(x) for x in zip(*main, strict=True)) if main else (0, 0, 0)
    inits = [one(c) for c in spec.get("initContainers") or []]
    g, c, m = total
    return max([g, *(i[0] for i in inits)]), max([c, *(i[1] for i in inits)]), max([m, *(i[2] for i in inits)])


def node_use(pod: Mapping[str, Any], quantity: Quantity) -> NodeUse | None:
    """What a pod placed by someone else holds, while it can still run; None for one not on a node or ended."""
    node = (pod.get("spec") or {}).get("nodeName") or ""
    phase = (pod.get("status") or {}).get("phase", "Pending")
    if not node or phase in ("Succeeded", "Failed"):
        return None
    return NodeUse(node, *requests_of(pod["spec"], quantity))


def _mib(text: str) -> int | None:
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        return None
    mib = int(float(m.group(1)) * _SCALE_MIB[m.group(2).upper()])
    return mib if mib >= 1 else None


def foreign_pod(pod: Mapping[str, Any], quantity: Quantity) -> ForeignPod:
    meta, spec = pod["metadata"], pod.get("spec") or {}
    labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
    gpus, cpu, memory = requests_of(spec, quantity)
    milli = mem = 0
    error = None
    fraction, size = notes.get(GPU_FRACTION), notes.get(GPU_MEMORY)
    if fraction is not None or size is not None:
        if gpus or (fraction is not None and size is not None):
            error = f"ask for one of {GPU} (whole GPUs), {GPU_FRACTION} or {GPU_MEMORY}, not several"
        elif fraction is not None:
            try:
                f = float(fraction)
            except ValueError:
                f = 0.0
            if not 0 < f < 1:
                error = f"{GPU_FRACTION} {fraction[:40]!r} is not a fraction between 0 and 1"
            milli = max(1, min(999, round(f * 1000)))
        else:
            assert size is not None
            mem = _mib(size) or 0
            if not mem:
                error = f"{GPU_MEMORY} {size[:40]!r}: expected a size like 20GiB or 512MiB"
    containers = spec.get("containers") or [{}]
    controller = next((r for r in meta.get("ownerReferences") or [] if r.get("controller")), None)
    owner = None
    if controller is not None:
        owner = Owner(controller.get("apiVersion", ""), controller.get("kind", ""), controller.get("name", ""),
                      controller.get("uid", ""))  # fmt: skip
    return ForeignPod(
        uid=meta["uid"],
        namespace=meta["namespace"],
        name=meta["name"],
        node=spec.get("nodeName") or "",
        phase=(pod.get("status") or {}).get("phase", "Pending"),
        deleting=bool(meta.get("deletionTimestamp")),
        project=labels.get(PROJECT),
        priority_class=spec.get("priorityClassName"),
        priority=labels.get(PRIORITY),
        gpus=gpus,
        gpu_milli=milli,
        gpu_memory_mib=mem,
        cpu_milli=cpu,
        memory_mib=memory,
        image=containers[0].get("image"),
        grace_s=float(spec.get("terminationGracePeriodSeconds", 30)),
        error=error,
        allocation=notes.get(ALLOCATION),
        owner=owner,
        pod_group=labels.get(POD_GROUP),
        rank=(
            _first(labels, notes, _ROLE_KEYS),
            _number(labels, notes, _JOB_KEYS),
            _number(labels, notes, _INDEX_KEYS),
            meta["name"],
        ),
    )


def _first(labels: Mapping[str, str], notes: Mapping[str, str], keys: tuple[str, ...]) -> str:
    return next((str(m[k]) for k in keys for m in (labels, notes) if k in m), "")


def _number(labels: Mapping[str, str], notes: Mapping[str, str], keys: tuple[str, ...]) -> int:
    text = _first(labels, notes, keys)
    return int(text) if text.isdigit() else 0


def unschedulable_condition(message: str, now: str) -> dict[str, Any]:
    """PodScheduled=False, as kube-scheduler writes it (reason Unschedulable: what autoscalers look for)."""
    return {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
            "lastTransitionTime": now}  # fmt: skip


def event(
    involved: dict[str, str], reason: str, message: str, warning: bool, now: str, suffix: str, component: str
) -> dict[str, Any]:
    """An Event on an object (`involved`: its apiVersion, kind, namespace, name and uid), as kube-scheduler and the
    controllers record theirs."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{involved['name']}.{suffix}"[:253], "namespace": involved["namespace"]},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": component,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def scheduling_event(pod: ForeignPod, message: str, now: str, suffix: str, component: str) -> dict[str, Any]:
    """A Warning event FailedScheduling on the pod, as kube-scheduler records one."""
    involved = {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace, "name": pod.name, "uid": pod.uid}
    return event(involved, "FailedScheduling", message, True, now, suffix, component)


def binding(pod: ForeignPod, node: str, annotations: dict[str, str]) -> dict[str, Any]:
    """The Binding a scheduler makes; the uid makes the API server refuse it for another pod of the same name. The
    API server copies its annotations onto the pod with its node, in the same write."""
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid, "annotations": annotations},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
