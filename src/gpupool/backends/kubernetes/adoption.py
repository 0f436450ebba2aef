"""What the Kubernetes backend does with pods it did not make: it reads those that name gpupool as their scheduler
(their project, from the pod's label or its namespace's), binds them where gpupool placed them, and tells those that
wait or are refused why, with an Event and their PodScheduled condition, as kube-scheduler does."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from gpupool.backends.base import LaunchSpec, LaunchWaits
from gpupool.backends.kubernetes.admission import Admitter
from gpupool.backends.kubernetes.foreign import (
    PROJECT,
    VISIBLE_DEVICES,
    ForeignPod,
    binding,
    scheduling_event,
    unschedulable_condition,
)
from gpupool.backends.kubernetes.gangs import GangReader, Unreadable
from gpupool.backends.kubernetes.manifests import ALLOC, DEVICES, device_uuid, granted
from gpupool.backends.kubernetes.podwatch import PodWatch
from gpupool.core import Node

log = logging.getLogger("gpupool.kubernetes")
NAMESPACE_TTL_S = 30.0
"""How long a namespace's project label is trusted before it is read again."""


Reserve = Callable[[str, int, str], None]
"""Holds a shared device for an allocation: (node, device index, allocation id)."""


class PodGone(RuntimeError):
    """A member of a workload made from pods has no pod left to bind."""


class BindConflict(RuntimeError):
    """The pod is bound to another node than the one gpupool chose (someone else bound it first)."""


class ForeignPods:
    def __init__(self, core: Any, client: Any, watch: PodWatch, component: str) -> None:
        self.core = core
        self._client = client
        self.watch = watch
        self.component = component
        self._lock = threading.Lock()
        self._claimed: dict[tuple[int, int], ForeignPod] = {}
        """(Workload id, member) → its pod, as the control loop said (from the store, every pod it has a workload
        for)."""
        self._adopted: set[int] = set()
        self._admitted: set[int] = set()
        self._namespaces: dict[str, tuple[str | None, float]] = {}
        self._told: dict[str, str] = {}
        """Pod uid → the message its condition and last event carry (written again only when it changes)."""
        self.gangs = GangReader(core.api_client, client)
        self.admitter = Admitter(core.api_client, client, watch.scheduler, component)
        """The Jobs and JobSets that wait for gpupool's admission (gpupool.control.admission)."""
        self.allocs: set[str] = set()
        """Allocations that are foreign pods: an ended one is left to its own controller, never deleted here."""

    def pods(self) -> tuple[int, list[ForeignPod]]:
        """The foreign pods, each with its project (its label's, else its namespace's), and the watch's count of
        changes they reflect."""
        with self.watch.lock:
            generation, pods = self.watch.foreign_generation, sorted(self.watch.foreign.values(), key=lambda p: p.uid)
        out = []
        for pod in pods:
            if pod.project is None:
                project = self._namespace_project(pod.namespace)
                if project is not None:
                    pod = replace(pod, project=project)
            if pod.error is None and not (pod.ended or pod.deleting or pod.node):  # only unbound pods are grouped
                try:
                    pod = replace(pod, gang=self.gangs.gang(pod))
                except Unreadable as e:
                    pod = replace(pod, error=f"its gang is unknown: {e}")
            out.append(pod)
        return generation, out

    def _namespace_project(self, namespace: str) -> str | None:
        now = time.monotonic()
        kept = self._namespaces.get(namespace)
        if kept is not None and now - kept[1] < NAMESPACE_TTL_S:
            return kept[0]
        try:
            labels = self.core.read_namespace(namespace).metadata.labels or {}
        except Exception as e:  # an API error or a dropped connection
            # Never the cycle's failure: the pod waits (as it was, or without a project) until the next read.
            if getattr(e, "status", None) not in (403, 404):
                log.warning("reading namespace %s failed (%s); reading it again shortly", namespace, e)
                return kept[0] if kept is not None else None
            labels = {}
        project = labels.get(PROJECT)
        self._namespaces[namespace] = (project, now)
        return project

    def claim(self, pods: dict[tuple[int, int], ForeignPod], adopted: set[int], admitted: set[int]) -> None:
        """The pods the store has workloads for, by workload id and member (all of them, each cycle they change),
        the live workloads made from pods (whether their pods are still there or not), and those of admitted Jobs
        (whose pods may not have been made yet)."""
        self.watch.claim({p.uid: key for key, p in pods.items()})
        with self._lock:
            self._claimed = dict(pods)
            self._adopted = set(adopted)
            self._admitted = set(admitted)
            live = {p.uid for p in pods.values()}
            with self.watch.lock:
                live |= self.watch.foreign.keys()
            self._told = {uid: m for uid, m in self._told.items() if uid in live}

    def claimed(self, workload_id: int, member: int) -> ForeignPod | None:
        """The member's pod; raises PodGone for a workload made from pods whose pod is gone (never launched as one
        of gpupool's own: its workload is ended when gpupool next looks at the pods)."""
        with self._lock:
            pod = self._claimed.get((workload_id, member))
            if pod is None and workload_id in self._admitted:
                raise LaunchWaits("its Job is unsuspended; its controller has not made all its pods yet")
            if pod is None and workload_id in self._adopted:
                raise PodGone(f"the pod of member {member} of workload {workload_id} is gone")
            return pod

    def bind(
        self,
        spec: LaunchSpec,
        pod: ForeignPod,
        reserve: Callable[[str, int, str], None],
        unreserve: Callable[[str], None],
    ) -> None:
        """Binds the pod to the chosen node, idempotently: bound there already is done; bound elsewhere raises
        BindConflict. A fraction's device is reserved first, as for gpupool's own sharers (`reserve(node, index,
        alloc)`; `unreserve(alloc)` if the bind fails)."""
        try:
            for d in spec.devices:
                if d.milli < 1000:
                    reserve(spec.node, d.index, spec.alloc_id)
            self._bind(spec, pod)
        except Exception:
            unreserve(spec.alloc_id)
            raise

    def _bind(self, spec: LaunchSpec, pod: ForeignPod) -> None:
        """Its allocation and devices go in the Binding's annotations, which the API server writes onto the pod with
        its node: the watch knows it as this allocation's from the moment it is bound, and a refused Binding leaves
        nothing behind."""
        shared = [d for d in spec.devices if d.milli < 1000]
        notes = {ALLOC: spec.alloc_id, DEVICES: ",".join(f"{d.index}:{d.milli}" for d in spec.devices)}
        if shared:
            notes[VISIBLE_DEVICES] = device_uuid(spec.node, shared[0].index)
        self.allocs.add(spec.alloc_id)
        try:
            # The generated client cannot read the Status this answers with, so it is not deserialised; it is read
            # all the same, so the connection goes back to the pool (unread, each bind paid a new TLS handshake).
            answer = self.core.create_namespaced_pod_binding(
                pod.name, pod.namespace, binding(pod, spec.node, notes), _preload_content=False
            )
            answer.read()
            answer.release_conn()
        except self._client.ApiException as e:
            if e.status != 409:
                raise
            where = self.core.read_namespaced_pod(pod.name, pod.namespace).spec.node_name
            if where != spec.node:
                # Not gpupool's binding: without its allocation the control loop sees a pod another scheduler bound,
                # ends its workload and counts the pod as capacity in use.
                raise BindConflict(f"pod {pod.namespace}/{pod.name} is bound to {where}, not {spec.node}") from None
        with self._lock:
            self._told.pop(pod.uid, None)
        self.watch.launched(spec.alloc_id, pod.name, pod.namespace)

    def unschedulable(self, pod: ForeignPod, message: str) -> None:
        """Tell a pod why gpupool does not place it (refused, or waiting): its PodScheduled condition says so, and
        a FailedScheduling event records it. Only when the message changes: waiting costs no write per cycle."""
        with self._lock:
            if self._told.get(pod.uid) == message:
                return
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        status = {"status": {"conditions": [unschedulable_condition(message, now)]}}
        try:
            self.core.patch_namespaced_pod_status(pod.name, pod.namespace, status)
            event = scheduling_event(pod, message, now, f"{time.time_ns():x}", self.component)
            self.core.create_namespaced_event(pod.namespace, event)
        except self._client.ApiException as e:
            if e.status != 404:  # gone meanwhile: nobody to tell
                log.warning("telling pod %s/%s why it waits failed: %s", pod.namespace, pod.name, e.reason)
            return
        with self._lock:
            self._told[pod.uid] = message

    def suspends(self, alloc_id: str) -> bool:
        """Whether a stop of this allocation is carried out by suspending its Job (an admitted one's: its controller
        removes its pods) rather than by deleting its pod."""
        wid = alloc_id.split("-", 1)[0]
        with self._lock:
            return wid.isdigit() and int(wid) in self._admitted

    def disrupt(self, name: str, namespace: str) -> None:
        """Before gpupool deletes a pod it did not make (preemption, reclaim, a cancel), the pod says so as
        kube-scheduler's victims do: DisruptionTarget=True, reason PreemptionByScheduler. A Job's podFailurePolicy
        can then leave the deletion out of its failures (`onPodConditions: [{type: DisruptionTarget}]`)."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        cond = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                "message": f"{self.component}: stopped by gpupool", "lastTransitionTime": now}  # fmt: skip
        try:
            self.core.patch_namespaced_pod_status(name, namespace, {"status": {"conditions": [cond]}})
        except self._client.ApiException as e:
            if e.status != 404:
                log.warning("marking pod %s/%s for deletion failed: %s", namespace, name, e.reason)

    def less_used(self, node: Node) -> Node:
        """The node less what pods another scheduler placed on it hold. Their whole GPUs are taken from the devices
        gpupool's own pods do not hold, highest index first (the device plugin chose theirs, unknown to gpupool;
        gpupool's grants start from the lowest). Where they hold more than is free, the node is over-committed:
        gpupool offers none, and keeps what it holds."""
        with self.watch.lock:
            used = [u for u in self.watch.used.values() if u.node == node.name]
            if not used:
                return node
            held = {i for (n, i), allocs in self.watch.launching.items() if n == node.name and allocs}
            held |= {i for (n, i) in self.watch.reservations if n == node.name}
            for pod in self.watch.pods.values():
                phase = (pod.get("status") or {}).get("phase")
                if pod["spec"].get("nodeName") == node.name and phase not in ("Succeeded", "Failed"):
                    held.update(i for i, _ in granted(pod))
        free = [d for d in node.devices if d.index not in held]
        taken = {d.index for d in free[max(0, len(free) - sum(u.gpus for u in used)) :]}
        return replace(
            node,
            cpu_milli=max(0, node.cpu_milli - sum(u.cpu_milli for u in used)),
            memory_mib=max(0, node.memory_mib - sum(u.memory_mib for u in used)),
            devices=tuple(d for d in node.devices if d.index not in taken),
        )
