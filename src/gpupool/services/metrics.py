"""One workload's GPU use over time, read from its usage minutes (the meter writes them as it runs)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.models.metrics import MetricsPoint, WorkloadMetrics
from gpupool.services import workloads
from gpupool.services.auth import Principal
from gpupool.services.errors import Invalid
from gpupool.services.reports import check_instants
from gpupool.store.tables import QueueRow, UsageRow

MAX_MINUTES = 7 * 24 * 60
"""A week of minutes at most per answer: a chart has no room for more."""


def workload_metrics(
    session: Session, who: Principal, ref: str, project: str | None, start: float, end: float
) -> WorkloadMetrics:
    """Per minute from `start` to `end` (the minutes that begin in it): GPUs held, how busy they were, and peak
    GPU memory. Minutes it held nothing are absent."""
    check_instants(start=start, end=end)
    if end <= start:
        raise Invalid("the period is empty: 'end' must be after 'start'")
    first, last = int(start // 60), int(end // 60)
    if last - first > MAX_MINUTES:
        raise Invalid(f"a period of at most {MAX_MINUTES // 1440} days, please")
    row = workloads.find(session, who, ref, project)
    rows = session.scalars(
        select(UsageRow)
        .where(UsageRow.workload_id == row.id, UsageRow.minute >= first, UsageRow.minute <= last)
        .order_by(UsageRow.minute)
    )
    points = [
        MetricsPoint(
            at=u.minute * 60.0,
            gpus=round(u.milli_seconds / 60_000, 3),
            gpu_util_pct=round(100 * u.busy_milli_seconds / u.milli_seconds, 1) if u.milli_seconds > 0 else None,
            gpu_memory_mib=u.gpu_memory_mib,
        )
        for u in rows
    ]
    owner = session.get(QueueRow, row.project_id)
    return WorkloadMetrics(workload=row.name, project=owner.name if owner else "", start=start, end=end, points=points)
