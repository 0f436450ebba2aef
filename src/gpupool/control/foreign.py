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
- Pods of one gang (the backend says which: gpupool.backends.kubernetes.gangs) become one workload of one member
  each, made only once all of them exist, so it is placed all or nothing; until then each says how many exist, and
  after `gang_timeout_s` that the gang is overdue. Its members must ask for the same GPUs (CPU and memory: the
  most any asks). One member's pod lost ends the whole gang: its controller makes new pods, a new gang.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gpupool.control.admission import Admissions, admission_row
from gpupool.control.pod_rules import gang_origin, gang_request, priority_for, workload_name
from gpupool.control.view import WorkloadView
from gpupool.core.priority import DEFAULT_CLASSES, PriorityClass
from gpupool.durations import format_duration
from gpupool.lifecycle import transitions as lifecycle
from gpupool.lifecycle.phases import TERMINAL, Phase
from gpupool.store.tables import MembershipRow, QueueRow, UserRow, WorkloadPodRow, WorkloadRow

if TYPE_CHECKING:
    from gpupool.backends.kubernetes.admission import Suspendable
    from gpupool.backends.kubernetes.foreign import ForeignPod, Gang

log = logging.getLogger("gpupool.control")
BY = "kubernetes"
"""Who the events of adopted workloads name as having submitted or cancelled them."""
RECHECK_S = 10.0
"""Refused pods are looked at again this often (a project may have been made for them since)."""
GANG_TIMEOUT_S = 600.0


def _settled(pod: ForeignPod) -> bool:
    return pod.ended or pod.deleting or bool(pod.node)


def _lost(pod: ForeignPod | None) -> bool:
    """Gone, going, or bound by someone else (on a node without gpupool's allocation on it)."""
    return pod is None or pod.deleting or bool(pod.node and pod.allocation is None)


class Adoption:
    def __init__(self, classes: Iterable[PriorityClass] = DEFAULT_CLASSES, gang_timeout_s: float = GANG_TIMEOUT_S):
        self.classes = tuple(classes)
        self.gang_timeout_s = gang_timeout_s
        self.known: dict[str, int] = {}
        """Pod uid → its workload's id."""
        self.members: dict[int, list[str]] = {}
        """Workload id → its members' pod uids, by member."""
        self._loaded = False
        self.admissions = Admissions()
        """Jobs and JobSets admitted by unsuspending them (gpupool.control.admission)."""
        self._incomplete: dict[str, float] = {}
        """Gang uid → since when some of its pods exist, not all (monotonic)."""
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
        admitter = getattr(foreign, "admitter", None)
        if admitter is not None:
            with sessions() as s, s.no_autoflush:
                queues = {q.name: q for q in s.scalars(select(QueueRow).where(QueueRow.kind == "project"))}

                def make(s: Session, obj: Suspendable, project: QueueRow) -> WorkloadRow:
                    return self._admitted(s, obj, project, now)

                if self.admissions.step(s, admitter, queues, now, lambda o: self._object_refusal(o, queues), make):
                    commit(s)
                    self._claim(foreign)
        generation, pods = foreign.pods()
        if generation == self._generation and time.monotonic() - self._looked < RECHECK_S:
            return
        self._generation, self._looked = generation, time.monotonic()
        self.pods = {p.uid: p for p in pods}
        with sessions() as s, s.no_autoflush:
            self._find(s)
            self._end_gone(s, now)
            queues = {q.name: q for q in s.scalars(select(QueueRow).where(QueueRow.kind == "project"))}
            gangs: dict[str, list[ForeignPod]] = {}
            singles: list[tuple[ForeignPod, QueueRow]] = []
            for pod in pods:
                if pod.uid in self.known or _settled(pod):
                    continue  # bound by someone else, or ended, before gpupool took it: not gpupool's
                if pod.gang is not None and pod.error is None:
                    gangs.setdefault(pod.gang.uid, []).append(pod)
                    continue
                refusal = self._refusal(pod, queues)
                if refusal is not None:
                    foreign.unschedulable(pod, refusal)
                    continue
                assert pod.project is not None
                singles.append((pod, queues[pod.project]))
            self._adopt_singles(s, singles, now)
            for uid in set(self._incomplete) - gangs.keys():
                del self._incomplete[uid]
            for _, members in sorted(gangs.items()):
                self._gang(s, sorted(members, key=lambda p: p.rank), queues, foreign, now)
            commit(s)
        self._claim(foreign)

    def _claim(self, foreign: Any) -> None:
        """Tell the backend which pods are which workload's members, and which workloads have or will have pods."""
        admitted = set(self.admissions.by_uid.values())
        foreign.claim(
            {(wid, i): self.pods[uid] for wid, uids in self.members.items() for i, uid in enumerate(uids)
             if uid in self.pods},
            set(self.members) | admitted,
            admitted,
        )  # fmt: skip

    def _find(self, s: Session) -> None:
        """Pods the store has workloads for already (a restarted server, another leader's adoptions)."""
        self._strangers &= self.pods.keys()
        unknown = [uid for uid in self.pods if uid not in self.known and uid not in self._strangers]
        found: set[int] = set()
        if not self._loaded:
            # Every live adopted workload, its pods there or not: one whose pods went while no server looked is
            # ended here, never placed with nothing to bind.
            live = (
                select(WorkloadPodRow.pod_uid, WorkloadPodRow.workload_id)
                .join(WorkloadRow, WorkloadRow.id == WorkloadPodRow.workload_id)
                .where(WorkloadRow.state.not_in([p.value for p in TERMINAL]))
            )
            for uid, wid in s.execute(live):
                self.known[str(uid)] = int(wid)
                found.add(int(wid))
            self._loaded = True
        for i in range(0, len(unknown), 500):
            query = select(WorkloadPodRow.pod_uid, WorkloadPodRow.workload_id).where(
                WorkloadPodRow.pod_uid.in_(unknown[i : i + 500])
            )
            for uid, wid in s.execute(query):
                self.known[str(uid)] = int(wid)
                found.add(int(wid))
        new = sorted(found - self.members.keys())
        for i in range(0, len(new), 500):
            by_member = select(WorkloadPodRow.workload_id, WorkloadPodRow.member, WorkloadPodRow.pod_uid).where(
                WorkloadPodRow.workload_id.in_(new[i : i + 500])
            )
            for wid, member, uid in sorted(s.execute(by_member).tuples()):
                self.members.setdefault(int(wid), []).append(str(uid))
                assert len(self.members[int(wid)]) == member + 1, "a workload's pods are its members 0..n-1"
        # Not found, and never to be adopted (ended, going, or bound by someone else): not looked up again.
        self._strangers |= {u for u in unknown if u not in self.known and _settled(self.pods[u])}

    def _end_gone(self, s: Session, now: float) -> None:
        """A pod deleted, being deleted or bound by another scheduler ends its workload (cancelled)."""
        ending: dict[int, str] = {}
        for uid, wid in sorted(self.known.items()):
            if _lost(self.pods.get(uid)):
                ending.setdefault(wid, uid)
        if not ending:
            return
        for row in s.scalars(select(WorkloadRow).where(WorkloadRow.id.in_(list(ending)))):
            if row.state in TERMINAL:
                gone = [u for u in self.members.get(row.id, [ending[row.id]]) if u not in self.pods]
                for uid in gone:
                    self.known.pop(uid, None)
                if len(gone) == len(self.members.get(row.id, [])):
                    self.members.pop(row.id, None)
                continue
            if row.id in self.admissions.by_uid.values():
                # An admitted Job's workload outlives its pods: once all are gone it takes the next ones.
                uids = self.members.get(row.id, [])
                if all(_lost(self.pods.get(u)) for u in uids):
                    for uid in uids:
                        self.known.pop(uid, None)
                    self.members.pop(row.id, None)
                    self.admissions.detach(s, [row.id])
                continue
            if row.stop_reason is not None:
                # A stop under way ends it (a preempted one is queued, then cancelled: its pods are gone): looked
                # at again next cycle, whether or not a pod changes by then.
                self._generation = None
                continue
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

    def _gang(self, s: Session, pods: list[ForeignPod], queues: dict[str, QueueRow], foreign: Any, now: float) -> None:
        """A gang's pods none of which has a workload yet: one workload for them all once all exist."""
        gang = pods[0].gang
        assert gang is not None
        if len(pods) < gang.size:
            since = self._incomplete.setdefault(gang.uid, time.monotonic())
            waited = time.monotonic() - since
            what = f"{len(pods)} of {gang.size} pods of {gang.kind} {gang.namespace}/{gang.name}"
            if waited < self.gang_timeout_s:
                message = f"gang-incomplete: {what} exist; gpupool places them together once all do"
            else:
                after = format_duration(self.gang_timeout_s)
                message = (f"gang-timeout: only {what} exist after {after}; gpupool places none until all do "
                           "(its controller may be short of quota, or failing to make pods)")  # fmt: skip
            for pod in pods:
                foreign.unschedulable(pod, message)
            return
        self._incomplete.pop(gang.uid, None)
        members = pods[: gang.size]  # more: replacements of pods still going, which join the next gang
        admitted = self.admissions.workload_of(gang.uid)
        if admitted is not None:
            if admitted not in self.members:  # else: its last pods have not all gone yet
                self._attach(s, admitted, members)
            return
        refusal = next((r for r in (self._refusal(p, queues) for p in members) if r is not None), None)
        asks = gang_request(members)
        if refusal is None and isinstance(asks, str):
            refusal = asks
        if refusal is not None:
            for pod in members:
                foreign.unschedulable(pod, refusal)
            return
        assert members[0].project is not None and not isinstance(asks, str)
        self._adopt(s, members, gang, queues[members[0].project], now, asks)

    def _attach(self, s: Session, wid: int, pods: list[ForeignPod]) -> None:
        """An admitted Job's pods, all there: the members of its workload, bound where it was placed."""
        origin = s.scalar(select(WorkloadRow.origin).where(WorkloadRow.id == wid)) or {}
        try:
            with s.begin_nested():
                s.add_all(WorkloadPodRow(pod_uid=p.uid, workload_id=wid, member=i) for i, p in enumerate(pods))
                # Which pods it runs as, for describe; no scheduling decision reads it (no version stamp).
                named = {**origin, "pods": [p.name for p in pods]}
                s.execute(update(WorkloadRow).where(WorkloadRow.id == wid).values(origin=named))
                s.flush()
        except IntegrityError:  # taken meanwhile by another server: next look
            self._generation = None
            return
        for p in pods:
            self.known[p.uid] = wid
        self.members[wid] = [p.uid for p in pods]
        log.info("the %d pods of %s/%s are workload %d's members", len(pods), pods[0].namespace, pods[0].name, wid)

    def _object_refusal(self, obj: Suspendable, queues: dict[str, QueueRow]) -> str | None:
        asks = gang_request(list(obj.members))
        if isinstance(asks, str):
            return asks
        return self._refusal(obj.members[0], queues)

    def _admitted(self, s: Session, obj: Suspendable, project: QueueRow, now: float) -> WorkloadRow:
        asks = gang_request(list(obj.members))
        assert not isinstance(asks, str)
        member = replace(obj.members[0], cpu_milli=asks[0], memory_mib=asks[1])
        klass = priority_for(member, self.classes)
        assert not isinstance(klass, str)
        base = replace(member, name=obj.name, uid=obj.uid)
        name = workload_name(base, False)
        taken = s.scalar(
            select(WorkloadRow.id).where(WorkloadRow.project_id == project.id, WorkloadRow.live_name == name)
        )
        name = workload_name(base, taken is not None)
        row = admission_row(obj, member, project, self._owner(s, project, now), klass, name, now)
        s.add(row)
        s.flush()
        s.add(lifecycle.submitted(row, BY, now))
        log.info("%s %s/%s waits for admission as workload %s/%s (id %d)", obj.kind, obj.namespace, obj.name,
                 project.name, name, row.id)  # fmt: skip
        return row

    def _adopt(
        self,
        s: Session,
        pods: list[ForeignPod],
        gang: Gang | None,
        project: QueueRow,
        now: float,
        asks: tuple[int, int] | None = None,
    ) -> None:
        pod = pods[0]
        base = pod if gang is None else replace(pod, name=gang.name, uid=gang.uid)
        name = workload_name(base, False)
        taken = s.scalar(
            select(WorkloadRow.id).where(WorkloadRow.project_id == project.id, WorkloadRow.live_name == name)
        )
        row = self._row(s, pods, gang, project, workload_name(base, taken is not None), now, asks)
        try:
            with s.begin_nested():
                s.add(row)
                s.flush()
                s.add_all(WorkloadPodRow(pod_uid=p.uid, workload_id=row.id, member=i) for i, p in enumerate(pods))
                s.flush()
        except IntegrityError:  # adopted meanwhile by another server, or its name taken since: next look
            log.info("pod %s/%s was not adopted this time (its uid or name is taken)", pod.namespace, pod.name)
            self._generation = None
            return
        self._adopted(s, row, pods, now)
        what = f"pod {pod.namespace}/{pod.name}" if gang is None else f"{gang.kind} {gang.namespace}/{gang.name}"
        log.info("%s is workload %s/%s (id %d, %d pods)", what, project.name, row.name, row.id, len(pods))

    def _adopt_singles(self, s: Session, singles: list[tuple[ForeignPod, QueueRow]], now: float) -> None:
        """Pods on their own, all of a pass at once: one name query per project and one insert. Should one be taken
        meanwhile (another server adopted it, a name was given since), one at a time."""
        if not singles:
            return
        wanted: dict[int, set[str]] = {}
        for pod, project in singles:
            wanted.setdefault(project.id, set()).add(workload_name(pod, False))
        taken: set[tuple[int, str]] = set()
        for pid, names in sorted(wanted.items()):
            listed = sorted(names)
            for i in range(0, len(listed), 500):
                query = select(WorkloadRow.live_name).where(
                    WorkloadRow.project_id == pid, WorkloadRow.live_name.in_(listed[i : i + 500])
                )
                taken |= {(pid, str(n)) for n in s.scalars(query)}
        rows = []
        for pod, project in singles:
            key = (project.id, workload_name(pod, False))
            rows.append(self._row(s, [pod], None, project, workload_name(pod, key in taken), now))
            taken.add(key)
        try:
            with s.begin_nested():
                s.add_all(rows)
                s.flush()
                pairs = zip(rows, singles, strict=True)
                s.add_all(WorkloadPodRow(pod_uid=p.uid, workload_id=r.id, member=0) for r, (p, _) in pairs)
                s.flush()
        except IntegrityError:
            for pod, project in singles:
                if pod.uid not in self.known:
                    self._adopt(s, [pod], None, project, now)
            return
        for row, (pod, _) in zip(rows, singles, strict=True):
            self._adopted(s, row, [pod], now)
        log.info("%d pods are workloads (ids %d-%d)", len(rows), rows[0].id, rows[-1].id)

    def _adopted(self, s: Session, row: WorkloadRow, pods: list[ForeignPod], now: float) -> None:
        s.add(lifecycle.submitted(row, BY, now))
        for p in pods:
            self.known[p.uid] = row.id
        self.members[row.id] = [p.uid for p in pods]

    def _row(
        self,
        s: Session,
        pods: list[ForeignPod],
        gang: Gang | None,
        project: QueueRow,
        name: str,
        now: float,
        asks: tuple[int, int] | None = None,
    ) -> WorkloadRow:
        pod = pods[0]
        klass = priority_for(pod, self.classes)
        assert not isinstance(klass, str)
        cpu, memory = asks if asks is not None else (pod.cpu_milli, pod.memory_mib)
        if gang is None:
            origin: dict[str, object] = {"kind": "Pod", "namespace": pod.namespace, "name": pod.name, "uid": pod.uid}
        else:
            origin = gang_origin(gang, pods)
        return WorkloadRow(
            name=name, project_id=project.id, owner_id=self._owner(s, project, now), type="training",
            priority_class=klass.name, priority=klass.value, preemptible=klass.preemptible,
            min_runtime_s=klass.min_runtime_s, gpus=pod.gpus, gpu_milli=pod.gpu_milli,
            gpu_memory_mib=pod.gpu_memory_mib, cpu_milli=cpu, memory_mib=memory, workers=len(pods),
            pools=[], gpu_models=[], command=[], image=pod.image, env={}, attempts=[],
            grace_s=max(p.grace_s for p in pods), state=Phase.PENDING.value, attempt=0, nominated=[],
            created_at=now, queued_at=now, allocations=[], origin=origin,
            origin_uid=pod.uid if gang is None else None,
        )  # fmt: skip

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
        waiting: dict[int, list[ForeignPod]] = {}
        for uid, wid in self.known.items():
            pod = self.pods.get(uid)
            kept = view.queued.get(wid)
            if pod is not None and not pod.node and kept is not None and kept.code is not None:
                waiting.setdefault(wid, []).append(pod)
        if not waiting:
            return
        with sessions() as s:
            etas = dict(
                s.execute(select(WorkloadRow.id, WorkloadRow.eta).where(WorkloadRow.id.in_(list(waiting)))).all()
            )
        for wid, pods in sorted(waiting.items()):
            kept = view.queued[wid]
            eta = etas.get(wid)
            when = f"; expected to start about {datetime.fromtimestamp(eta, UTC):%Y-%m-%d %H:%M} UTC" if eta else ""
            for pod in sorted(pods, key=lambda p: p.rank):
                foreign.unschedulable(pod, f"{kept.code}: {kept.detail}{when}")
