"""What the portal's charts read: each queue's standing from the last cycle, and usage minute by minute."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpupool.core import Decision
from gpupool.lifecycle.phases import QUEUED
from gpupool.models.schemas import ShareLine, TimelinePoint
from gpupool.services.auth import Principal
from gpupool.services.errors import Invalid
from gpupool.services.reports import check_instants
from gpupool.store.tables import QueueRow, UsageRow, WorkloadRow


def shares(session: Session, who: Principal, decision: Decision | None) -> list[ShareLine]:
    queues = {q.name: q for q in session.scalars(select(QueueRow))}
    names = {q.id: q.name for q in queues.values()}
    parents = {q.id: q.parent_id for q in queues.values()}
    pending = dict(
        session.execute(
            select(WorkloadRow.project_id, func.count())
            .where(WorkloadRow.state.in_(sorted(QUEUED)), WorkloadRow.hold.is_(False))
            .group_by(WorkloadRow.project_id)
        ).all()
    )
    out = []
    for s in decision.shares if decision else ():
        q = queues.get(s.queue)
        if q is None or not (who.can_read(q.id) if q.kind == "project" else who.sees_department(q.id, parents)):
            continue
        out.append(
            ShareLine(
                queue=s.queue,
                kind="project" if q.kind == "project" else "department",
                parent=names.get(q.parent_id) if q.parent_id is not None else None,
                pool=s.pool,
                deserved=s.deserved / 1000,
                fair_share=s.fair_share / 1000,
                allocated=s.allocated / 1000,
                limit=None if s.limit is None else s.limit / 1000,
                demand=s.demand / 1000,
                pending=int(pending.get(q.id, 0)) if q.kind == "project" else 0,
            )
        )
    return sorted(out, key=lambda x: (x.kind != "department", x.parent or "", x.queue, x.pool))


def timeline(session: Session, who: Principal, start: float, end: float) -> list[TimelinePoint]:
    """Allocated and busy GPUs per minute (averaged over the minute), in total and by project."""
    check_instants(start=start, end=end)
    if end <= start or end - start > 31 * 86400:
        raise Invalid("the period must be positive and at most 31 days")
    names = {q.id: q.name for q in session.scalars(select(QueueRow))}
    rows = session.execute(
        select(
            UsageRow.minute,
            WorkloadRow.project_id,
            func.sum(UsageRow.milli_seconds),
            func.sum(UsageRow.busy_milli_seconds),
        )
        .join(WorkloadRow, UsageRow.workload_id == WorkloadRow.id)
        .where(UsageRow.minute >= int(start // 60), UsageRow.minute <= int(end // 60))
        .group_by(UsageRow.minute, WorkloadRow.project_id)
        .order_by(UsageRow.minute)
    )
    points: dict[int, TimelinePoint] = {}
    for minute, project_id, allocated, busy in rows:
        if not who.can_read(project_id):
            continue
        point = points.setdefault(minute, TimelinePoint(at=minute * 60.0, allocated_gpus=0, busy_gpus=0, by_project={}))
        a, b = (allocated or 0) / 60_000, (busy or 0) / 60_000
        point.allocated_gpus = round(point.allocated_gpus + a, 4)
        point.busy_gpus = round(point.busy_gpus + b, 4)
        point.by_project[names.get(project_id, "?")] = [round(a, 4), round(b, 4)]
    return [points[m] for m in sorted(points)]
