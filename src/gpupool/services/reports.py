"""Usage and cost over a period: allocated GPU-hours, split into busy and idle by sampled utilisation, and their
cost split into on-premises (priced per pool) and burst (at the rented node's price); with the burst budget lines
of the departments the caller sees."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.models.clusters import MICRO
from gpupool.models.schemas import UsageLine, UsageReport
from gpupool.models.wire import UNIX_MAX, UNIX_MIN
from gpupool.services.auth import Principal
from gpupool.services.burst_costs import budget_lines
from gpupool.services.errors import Invalid
from gpupool.store.tables import QueueRow, UsageRow, UserRow, WorkloadRow

_HOUR = 3600 * 1000  # milli-GPU-seconds in a GPU-hour


def check_instants(**instants: float) -> None:
    """Unix seconds that int() and the store can take: finite, and within the dates ISO can write."""
    for name, value in instants.items():
        if not math.isfinite(value) or not UNIX_MIN <= value <= UNIX_MAX:
            raise Invalid(f"{name} {value!r} is not a time: give Unix seconds between year 1 and year 9999")


DEFAULT_PERIOD_S = 86400.0
"""A report with no start covers the day to its end, as the portal's Costs page does."""


def usage(
    session: Session,
    who: Principal,
    start: float | None,
    end: float | None,
    by: str,
    prices: Mapping[str, float],
    now: float | None = None,
) -> UsageReport:
    """Usage on the fleet's own nodes is priced by its pool (`prices`, dollars per GPU-hour), usage on rented
    (burst) nodes at the price each node was rented at; the budget lines are burst_costs.budget_lines, as of
    `now` (the server's clock). The period ends at `now` unless `end` says otherwise, and starts a day before its
    end unless `start` does."""
    now = time.time() if now is None else now
    end = now if end is None else end
    start = end - DEFAULT_PERIOD_S if start is None else start
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
    runs: dict[str, set[int]] = {}  # the workloads (a name's runs, for --by workload) each line sums
    unpriced: set[str] = set()  # pools of the fleet's own nodes with usage the caller sees and no price
    burst_used: dict[str, float] = {}  # dollars of burst usage by department, whoever may read its projects
    for usage_row, project_id, owner_id, name in rows:
        project = queues[project_id]
        department = queues[project.parent_id].name if project.parent_id in queues else "(none)"
        burst_price = usage_row.burst_price_micro
        if burst_price is not None:
            used = usage_row.milli_seconds * burst_price / MICRO / _HOUR
            burst_used[department] = burst_used.get(department, 0.0) + used
        if not who.can_read(project_id):
            continue
        if by == "project":
            key = project.name
        elif by == "department":
            key = department
        elif by == "user":
            key = users.get(owner_id, "?")
        else:
            key = f"{project.name}/{name}"
        # allocated, busy, allocated on burst nodes; then those × dollars per GPU-hour: on-premises, busy of it,
        # burst, busy of it
        acc = sums.setdefault(key, [0.0] * 7)
        runs.setdefault(key, set()).add(usage_row.workload_id)
        acc[0] += usage_row.milli_seconds
        acc[1] += usage_row.busy_milli_seconds
        if burst_price is None:
            if usage_row.pool not in prices:
                unpriced.add(usage_row.pool)
            price = prices.get(usage_row.pool, 0.0)
            acc[3] += usage_row.milli_seconds * price
            acc[4] += usage_row.busy_milli_seconds * price
        else:
            price = burst_price / MICRO
            acc[2] += usage_row.milli_seconds
            acc[5] += usage_row.milli_seconds * price
            acc[6] += usage_row.busy_milli_seconds * price
    lines = [_line(key, len(runs[key]), *acc) for key, acc in sorted(sums.items())]
    every = len(set().union(*runs.values()))
    total = _line("total", every, *(sum(acc[i] for acc in sums.values()) for i in range(7)))
    budgets = budget_lines(session, who, start, end, now, burst_used)
    return UsageReport(
        start=start, end=end, by=by, lines=lines, total=total, budgets=budgets, unpriced_pools=sorted(unpriced)
    )


def _line(
    key: str, runs: int, allocated: float, busy: float, burst_allocated: float, on_prem: float, on_prem_busy: float,
    burst: float, burst_busy: float,
) -> UsageLine:  # fmt: skip
    """From milli-GPU-seconds, and those × dollars per GPU-hour."""
    cost, busy_cost = on_prem + burst, on_prem_busy + burst_busy
    return UsageLine(
        key=key,
        runs=runs,
        gpu_hours=round(allocated / _HOUR, 6),
        busy_gpu_hours=round(busy / _HOUR, 6),
        idle_gpu_hours=round((allocated - busy) / _HOUR, 6),
        cost=round(cost / _HOUR, 4),
        busy_cost=round(busy_cost / _HOUR, 4),
        idle_cost=round((cost - busy_cost) / _HOUR, 4),
        on_prem_cost=round(on_prem / _HOUR, 4),
        burst_cost=round(burst / _HOUR, 4),
        burst_gpu_hours=round(burst_allocated / _HOUR, 6),
    )
