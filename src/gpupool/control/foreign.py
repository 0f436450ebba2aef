"""Pods gpupool did not create that name it as their scheduler become workloads, and end with their pods.

A backend that has such pods (Kubernetes) offers them as `backend.foreign` (`pods()`, `claim()`, `unschedulable()`:
gpupool.backends.kubernetes.adoption); the loop
calls `Adoption.admit` before it reads what changed, as an API client would write (its own session, its own
commit), and `Adoption.explain` after, to tell the pods that wait why.

- A pod becomes one workload of one member, recorded with its origin ({kind, namespace, name, uid}); its uid is
  unique in the store, so listing the pods again never makes two.
- Its owner is its project's service account `svc-<project>-kubernetes` (made on first use, a member of that
  project only, with no token: nobody signs in as it). Whoever may create pods in a namespace mapped to a project
  submits as the project, as a service token of it would.
- Its priority class: the label `gpupool.io/priority` if it names one of gpupool's classes; else its
  priorityClassName if that names one; `system-node-critical` and `system-cluster-critical` are production;
  anything else (or none) is training, as a submitted training workload's. Production needs the project to allow
  it (`project set --production-allowed`), as for members who submit.
- A pod with no project, an unknown one, a production class its project does not allow or a request that cannot be
  read is refused: it gets a FailedScheduling event and PodScheduled=False with the reason, and no workload.
- A pod deleted (or being deleted) ends its workload through `lifecycle.cancel`: a queued one is cancelled, a live
  one is stopped and ends cancelled once its pod is gone. A new pod its controller makes is a new workload.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gpupool.control.view import WorkloadView
from gpupool.core.priority import DEFAULT_CLASSES, PriorityClass
from gpupool.lifecycle import transitions as lifecycle
from gpupool.lifecycle.phases import TERMINAL, Phase
from gpupool.store.tables import MembershipRow, QueueRow, UserRow, WorkloadRow

if TYPE_CHECKING:
    from gpupool.backends.kubernetes.foreign import ForeignPod

log = logging.getLogger("gpupool.control")
BY = "kubernetes"
"""Who the events of adopted workloads name as having submitted or cancelled them."""
CRITICAL = frozenset({"system-node-critical", "system-cluster-critical"})
DEFAULT_CLASS = "training"
RECHECK_S = 10.0
"""Refused pods are looked at again this often (a project may have been made for them since)."""


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


def _settled(pod: ForeignPod) -> bool:
    return pod.ended or pod.deleting or bool(pod.node)


def _lost(pod: ForeignPod | None) -> bool:
    """Gone, going, or bound by someone else (on a node without gpupool's allocation on it)."""
    return pod is None or pod.deleting or bool(pod.node and pod.allocation is None)


class Adoption:
    def __init__(self, classes: Iterable[PriorityClass] = DEFAULT_CLASSES) -> None:
        self.classes = tuple(classes)
        self.known: dict[str, int] = {}
        """Pod uid → its workload's id."""
        self.pods: dict[str, ForeignPod] = {}
        self._generation: int | None = None
        self._looked = 0.0
        self._owners: dict[int, int] = {}
        self._strangers: set[str] = set()
        """Uids of pods with no workload that will never have one (ended, going, or bound by someone else)."""

    def admit(
        self, sessions: sessionmaker[Session], backend: Any, now: float, commit: Callable[[Session], None]
    ) -> None:
        """Adopt new pods, end the workloads of pods gone, and give the backend the pods it has workloads for."""
        foreign = getattr(backend, "foreign", None)
        if foreign is None:
            return
        generation, pods = foreign.pods()
        if generation == self._generation and time.monotonic() - self._looked < RECHECK_S:
            return
        self._generation, self._looked = generation, time.monotonic()
        self.pods = {p.uid: p for p in pods}
        with sessions() as s, s.no_autoflush:
            self._find(s)
            self._end_gone(s, now)
            queues = {q.name: q for q in s.scalars(select(QueueRow).where(QueueRow.kind == "project"))}
            for pod in pods:
                if pod.uid in self.known or _settled(pod):
                    continue  # bound by someone else, or ended, before gpupool took it: not gpupool's
                refusal = self._refusal(pod, queues)
                if refusal is not None:
                    foreign.unschedulable(pod, refusal)
                    continue
                assert pod.project is not None
                self._adopt(s, pod, queues[pod.project], now)
            commit(s)
        foreign.claim({wid: self.pods[uid] for uid, wid in self.known.items() if uid in self.pods})

    def _find(self, s: Session) -> None:
        """Pods the store has workloads for already (a restarted server, another leader's adoptions)."""
        self._strangers &= self.pods.keys()
        unknown = [uid for uid in self.pods if uid not in self.known and uid not in self._strangers]
        for i in range(0, len(unknown), 500):
            query = select(WorkloadRow.origin_uid, WorkloadRow.id).where(
                WorkloadRow.origin_uid.in_(unknown[i : i + 500])
            )
            for uid, wid in s.execute(query):
                self.known[str(uid)] = int(wid)
        # Not found, and never to be adopted (ended, going, or bound by someone else): not looked up again.
        self._strangers |= {u for u in unknown if u not in self.known and _settled(self.pods[u])}

    def _end_gone(self, s: Session, now: float) -> None:
        """A pod deleted, being deleted or bound by another scheduler ends its workload (cancelled)."""
        ending = {wid: uid for uid, wid in self.known.items() if _lost(self.pods.get(uid))}
        if not ending:
            return
        for row in s.scalars(select(WorkloadRow).where(WorkloadRow.id.in_(list(ending)))):
            if row.state in TERMINAL:
                if ending[row.id] not in self.pods:
                    del self.known[ending[row.id]]
                continue
            if row.stop_reason is not None:
                continue  # a stop under way ends it (a preempted one is queued, then cancelled: its pod is gone)
            pod = self.pods.get(ending[row.id])
            elsewhere = pod is not None and not pod.deleting and pod.allocation is None
            by = f"{BY}: bound to {pod.node} by another scheduler" if pod is not None and elsewhere else BY
            event = lifecycle.cancel(row, by, now)
            if event is not None:
                s.add(event)

    def _refusal(self, pod: ForeignPod, queues: dict[str, QueueRow]) -> str | None:
        if pod.error is not None:
            return pod.error
        if pod.project is None:
            return "no gpupool project: label the pod or its namespace gpupool.io/project=<project>"
        project = queues.get(pod.project)
        if project is None:
            return f"no gpupool project named {pod.project[:63]!r}"
        klass = priority_for(pod, self.classes)
        if isinstance(klass, str):
            return klass
        if klass.name == "production" and not project.production_allowed:
            return f"project {project.name!r} does not allow production priority"
        return None

    def _adopt(self, s: Session, pod: ForeignPod, project: QueueRow, now: float) -> None:
        klass = priority_for(pod, self.classes)
        assert not isinstance(klass, str)
        name = workload_name(pod, False)
        taken = s.scalar(
            select(WorkloadRow.id).where(WorkloadRow.project_id == project.id, WorkloadRow.live_name == name)
        )
        name = workload_name(pod, taken is not None)
        row = WorkloadRow(
            name=name, project_id=project.id, owner_id=self._owner(s, project, now), type="training",
            priority_class=klass.name, priority=klass.value, preemptible=klass.preemptible,
            min_runtime_s=klass.min_runtime_s, gpus=pod.gpus, gpu_milli=pod.gpu_milli,
            gpu_memory_mib=pod.gpu_memory_mib, cpu_milli=pod.cpu_milli, memory_mib=pod.memory_mib, workers=1,
            pools=[], gpu_models=[], command=[], image=pod.image, env={}, attempts=[], grace_s=pod.grace_s,
            state=Phase.PENDING.value, attempt=0, nominated=[], created_at=now, queued_at=now, allocations=[],
            origin={"kind": "Pod", "namespace": pod.namespace, "name": pod.name, "uid": pod.uid},
            origin_uid=pod.uid,
        )  # fmt: skip
        try:
            with s.begin_nested():
                s.add(row)
                s.flush()
        except IntegrityError:  # adopted meanwhile by another server, or its name taken since: next look
            log.info("pod %s/%s was not adopted this time (its uid or name is taken)", pod.namespace, pod.name)
            self._generation = None
            return
        s.add(lifecycle.submitted(row, BY, now))
        self.known[pod.uid] = row.id
        log.info("pod %s/%s is workload %s/%s (id %d)", pod.namespace, pod.name, project.name, name, row.id)

    def _owner(self, s: Session, project: QueueRow, now: float) -> int:
        if project.id in self._owners:
            return self._owners[project.id]
        account = f"svc-{project.name}-kubernetes"[:63]
        user = s.scalar(select(UserRow).where(UserRow.name == account))
        if user is None:
            user = UserRow(name=account, role="member", kind="service", created_at=now)
            s.add(user)
            s.flush()
            s.add(MembershipRow(user_id=user.id, project_id=project.id, role="member"))
        self._owners[project.id] = user.id
        return user.id

    def explain(self, view: WorkloadView, backend: Any, sessions: sessionmaker[Session]) -> None:
        """Tell each adopted pod that waits why, as the scheduler last said, with when it is expected to start where
        that is known (to the minute). The backend writes only what changed: waiting costs no write per cycle."""
        foreign = getattr(backend, "foreign", None)
        if not self.known or foreign is None:
            return
        waiting: dict[int, ForeignPod] = {}
        for uid, wid in self.known.items():
            pod = self.pods.get(uid)
            kept = view.queued.get(wid)
            if pod is not None and not pod.node and kept is not None and kept.code is not None:
                waiting[wid] = pod
        if not waiting:
            return
        with sessions() as s:
            etas = dict(
                s.execute(select(WorkloadRow.id, WorkloadRow.eta).where(WorkloadRow.id.in_(list(waiting)))).all()
            )
        for wid, pod in sorted(waiting.items()):
            kept = view.queued[wid]
            eta = etas.get(wid)
            when = f"; expected to start about {datetime.fromtimestamp(eta, UTC):%Y-%m-%d %H:%M} UTC" if eta else ""
            foreign.unschedulable(pod, f"{kept.code}: {kept.detail}{when}")
