"""The rules that turn pods gpupool did not make into a workload's fields: its priority class, its name, a gang's
request and origin. Pure: the pods alone (gpupool.control.foreign applies them)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpupool.core.priority import DEFAULT_CLASSES, PriorityClass

if TYPE_CHECKING:
    from gpupool.backends.kubernetes.foreign import ForeignPod, Gang

CRITICAL = frozenset({"system-node-critical", "system-cluster-critical"})
DEFAULT_CLASS = "training"


def priority_for(pod: ForeignPod, classes: Iterable[PriorityClass] = DEFAULT_CLASSES) -> PriorityClass | str:
    """gpupool's class for a pod (see the module's note), or why its label names none."""
    by_name = {c.name: c for c in classes}
    if pod.priority is not None:
        return by_name.get(pod.priority) or f"gpupool.io/priority {pod.priority[:40]!r} names no class of gpupool's"
    name = pod.priority_class or ""
    if name in by_name:
        return by_name[name]
    return by_name["production" if name in CRITICAL else DEFAULT_CLASS]


def workload_name(pod: ForeignPod, taken: bool) -> str:
    """The pod's name as a workload name (a DNS label); with its uid's start when a live workload has it."""
    base = re.sub(r"[^a-z0-9-]+", "-", pod.name.lower()).strip("-") or "pod"
    if not taken:
        return base[:63].rstrip("-")
    return f"{base[:54].rstrip('-')}-{pod.uid.replace('-', '')[:8]}"


def gang_request(pods: list[ForeignPod]) -> tuple[int, int] | str:
    """The CPU and memory each member of a gang asks (the most any of its pods asks), or why its pods cannot be one
    gang: they ask for different GPUs, or name different projects."""
    first = pods[0]
    for p in pods[1:]:
        if (p.gpus, p.gpu_milli, p.gpu_memory_mib) != (first.gpus, first.gpu_milli, first.gpu_memory_mib):
            return (f"pods {first.name} and {p.name} of one gang ask for different GPUs: gpupool places a gang whose "
                    "pods ask the same (give a pod that differs a gang of its own)")  # fmt: skip
        if p.project != first.project:
            return f"pods {first.name} and {p.name} of one gang name different gpupool projects"
    return max(p.cpu_milli for p in pods), max(p.memory_mib for p in pods)


def gang_origin(gang: Gang, pods: list[ForeignPod]) -> dict[str, object]:
    names = [p.name for p in pods]
    return {"kind": gang.kind, "namespace": gang.namespace, "name": gang.name, "uid": gang.uid, "pods": names}
