"""Usage and cost over a period: allocated GPU-hours, split into busy and idle by sampled utilisation."""

from __future__ import annotations

import math
from collections.abc import Mapping

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.models.schemas import UsageLine, UsageReport
from gpupool.models.wire import UNIX_MAX, UNIX_MIN
from gpupool.services.auth import Principal
from gpupool.services.errors import Invalid
from gpupool.store.tables import QueueRow, UsageRow, UserRow, WorkloadRow

_HOUR = 3600 * 1000  # milli-GPU-seconds in a GPU-hour


def check_instants(**instants: float) -> None:
    """Unix seconds that int() and the store can take: finite, and within the dates ISO can write."""
    for name, value in instants.items():
        if not math.isfinite(value) or not UNIX_MIN <= value <= UNIX_MAX:
            raise Invalid(f"{name} {value!r} is not a time: give Unix seconds between year 1 and year 9999")


def usage(
    session: Session, who: Principal, start: float, end: float, by: str, prices: Mapping[str, float]
) -> UsageReport:
    check_instants(start=start, end=end)
    if end <= start:
        raise Invalid("the period is empty: 'to' must be after 'from'")
    if by not in ("department", "project", "user", "workload"):
        raise Invalid("by must be department, project, user or workload")
    queues = {q.id: q for q in session.scalars(select(QueueRow))}
    users = {u.id: u.name for u in session.scalars(select(UserRow))}
    rows = session.execute(
        select(UsageRow, WorkloadRow.project_id, WorkloadRow.owner_id, WorkloadRow.name)
        .join(WorkloadRow, UsageRow.workload_id == WorkloadRow.id)
        .where(UsageRow.minute >= int(start // 60), UsageRow.minute < int(-(-end // 60)))
    )
    sums: dict[str, list[float]] = {}
    for usage_row, project_id, owner_id, name in rows:
        if not who.can_read(project_id):
            continue
        project = queues[project_id]
        if by == "project":
            key = project.name
        elif by == "department":
            key = queues[project.parent_id].name if project.parent_id in queues else "(none)"
        elif by == "user":
            key = users.get(owner_id, "?")
        else:
            key = f"{project.name}/{name}"
        price = prices.get(usage_row.pool, 0.0)
        acc = sums.setdefault(key, [0.0, 0.0, 0.0, 0.0])
        acc[0] += usage_row.milli_seconds
        acc[1] += usage_row.busy_milli_seconds
        acc[2] += usage_row.milli_seconds * price
        acc[3] += usage_row.busy_milli_seconds * price
    lines = [_line(key, *acc) for key, acc in sorted(sums.items())]
    total = _line("total", *(sum(acc[i] for acc in sums.values()) for i in range(4)))
    return UsageReport(start=start, end=end, by=by, lines=lines, total=total)


def _line(key: str, allocated: float, busy: float, cost: float, busy_cost: float) -> UsageLine:
    return UsageLine(
        key=key,
        gpu_hours=round(allocated / _HOUR, 6),
        busy_gpu_hours=round(busy / _HOUR, 6),
        idle_gpu_hours=round((allocated - busy) / _HOUR, 6),
        cost=round(cost / _HOUR, 4),
        busy_cost=round(busy_cost / _HOUR, 4),
        idle_cost=round((cost - busy_cost) / _HOUR, 4),
    )
