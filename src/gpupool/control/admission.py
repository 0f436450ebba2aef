"""Suspend-based admission of Jobs and JobSets, as Kueue does it: one created suspended with the `gpupool.io/project`
label is a gang workload at once, made from its pod templates, with no pods. While it is queued the object stays
suspended (its controller makes no pod that could not run); once the scheduler places the whole gang within its
quota the object is unsuspended, and the pods its controller then makes become the workload's members, bound where
the gang was placed. Level-triggered from the store, each pass:

- queued, or being stopped (preempted, reclaimed, cancelled through gpupool): suspended, so its controller removes
  its pods (gpupool deletes them itself only once their grace period is over);
- placed and not being stopped: unsuspended;
- failed (a member did): unsuspended, back to its controller's own retries, its new pods a gang of their own;
- succeeded or cancelled: left as it is; the object deleted: its workload is cancelled.

A pod is the member of the admitted workload only once all its gang's pods exist (gpupool.control.foreign); when
they go (preempted, the object suspended), the workload keeps its place and takes the next ones.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.lifecycle import transitions as lifecycle
from gpupool.lifecycle.phases import ACTIVE, LIVE, QUEUED, TERMINAL, Phase
from gpupool.store.tables import QueueRow, WorkloadPodRow, WorkloadRow

if TYPE_CHECKING:
    from gpupool.backends.kubernetes.admission import Suspendable
    from gpupool.backends.kubernetes.foreign import ForeignPod
    from gpupool.core.priority import PriorityClass

log = logging.getLogger("gpupool.control")
BY = "kubernetes"


def wants_suspended(row: WorkloadRow) -> bool | None:
    """Whether its Job should be suspended now; None: left as it is. A stop (preempted, reclaimed, cancelled
    through gpupool, a policy's) suspends it: its controller removes its pods, as Kueue's evictions do, and gpupool
    deletes them itself only once their grace period is over. A gang that failed (a member did) goes back to its
    controller's own retries, unsuspended; a cancelled one stays suspended."""
    if row.state in QUEUED:
        return True
    if row.state in LIVE:
        return row.stop_reason is not None
    if row.state == Phase.FAILED:
        return False
    return None


class Admissions:
    def __init__(self) -> None:
        self.by_uid: dict[str, int] = {}
        """The uid of an admitted (or waiting) Job or JobSet → its live workload's id."""
        self._loaded = False
        self._told: dict[str, str] = {}
        self._seen: object = None

    def step(
        self,
        s: Session,
        admitter: Any,
        queues: dict[str, QueueRow],
        now: float,
        refusal: Any,
        make: Any,
    ) -> bool:
        """`refusal(obj)` says why an object may not be admitted; `make(s, obj, project)` makes its workload row
        (flushed). Only when the objects were listed again since the last step (every LIST_EVERY_S): returns whether
        it looked."""
        objects = admitter.objects()
        if objects is None or objects is self._seen:
            return False
        self._seen = objects
        listed = {o.uid: o for o in objects}
        if not self._loaded:
            self._load(s)
        rows = {r.id: r for r in s.scalars(select(WorkloadRow).where(WorkloadRow.id.in_(list(self.by_uid.values()))))}
        for uid, wid in sorted(self.by_uid.items()):
            row = rows.get(wid)
            obj = listed.get(uid)
            if row is None or row.state in TERMINAL:
                if row is not None:
                    row.origin_uid = None  # the object may wait for admission again (suspended anew)
                    if obj is not None and obj.suspended and wants_suspended(row) is False:
                        admitter.suspend(obj, False)
                del self.by_uid[uid]
                continue
            if obj is None:
                kind = (row.origin or {}).get("kind", "owner")
                event = lifecycle.cancel(row, f"{BY}: its {kind} was deleted", now)
                if event is not None:
                    s.add(event)
                continue
            want = wants_suspended(row)
            if want is not None and want != obj.suspended and not obj.finished:
                admitter.suspend(obj, want)
                if not want:
                    admitter.tell(obj, "Admitted", f"admitted by gpupool as workload {row.name} (id {row.id})", False)
        for obj in objects:
            if obj.uid in self.by_uid or not obj.suspended or obj.finished:
                continue
            why = obj.error or refusal(obj)
            if why is not None:
                if self._told.get(obj.uid) != why:
                    admitter.tell(obj, "FailedAdmission", why, True)
                    self._told[obj.uid] = why
                continue
            try:
                with s.begin_nested():
                    row = make(s, obj, queues[obj.project])
            except IntegrityError:  # made meanwhile by another server, or its name taken since: next pass
                continue
            self.by_uid[obj.uid] = row.id
            self._told.pop(obj.uid, None)
        self._told = {u: m for u, m in self._told.items() if u in listed}
        return True

    def _load(self, s: Session) -> None:
        """The live admitted workloads (after a restart, or another leader's)."""
        query = select(WorkloadRow.id, WorkloadRow.origin_uid, WorkloadRow.origin).where(
            WorkloadRow.state.in_([p.value for p in ACTIVE]), WorkloadRow.origin_uid.is_not(None)
        )
        for wid, uid, origin in s.execute(query):
            if isinstance(origin, dict) and origin.get("admission"):
                self.by_uid[str(uid)] = int(wid)
        self._loaded = True

    def detach(self, s: Session, wids: Iterable[int]) -> None:
        """Its pods went (preempted, its Job suspended): the admitted workload keeps its place for the next ones."""
        ids = sorted(wids)
        if ids:
            s.execute(delete(WorkloadPodRow).where(WorkloadPodRow.workload_id.in_(ids)))

    def workload_of(self, uid: str) -> int | None:
        return self.by_uid.get(uid)


def admission_row(
    obj: Suspendable, m: ForeignPod, project: QueueRow, owner: int, klass: PriorityClass, name: str, now: float
) -> WorkloadRow:
    """`m`: one member, as gang_request made it (the most CPU and memory any of the templates asks)."""
    origin = {"kind": obj.kind, "namespace": obj.namespace, "name": obj.name, "uid": obj.uid, "pods": [],
              "admission": True}  # fmt: skip
    return WorkloadRow(
        name=name, project_id=project.id, owner_id=owner, type="training", priority_class=klass.name,
        priority=klass.value, preemptible=klass.preemptible, min_runtime_s=klass.min_runtime_s, gpus=m.gpus,
        gpu_milli=m.gpu_milli, gpu_memory_mib=m.gpu_memory_mib, cpu_milli=m.cpu_milli, memory_mib=m.memory_mib,
        workers=obj.size, pools=[], gpu_models=[], command=[], image=m.image, env={}, attempts=[], grace_s=m.grace_s,
        state=Phase.PENDING.value, attempt=0, nominated=[], created_at=now, queued_at=now, allocations=[],
        origin=origin, origin_uid=obj.uid,
    )  # fmt: skip
