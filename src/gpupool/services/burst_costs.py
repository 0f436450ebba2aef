"""What bursting costs a department, from its rented nodes' bills (gpupool.store.burst_bills): its calendar month's
spending to now, the month at that pace, what the nodes it holds cost an hour; and, over a report's period, what
it rented and how much of that its projects' work did not use. The usage report's budget lines and a department's
burst settings read the same figures.

Money is exact in micro-dollars until it leaves here: each sum is rounded up once, then spoken in dollars."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.lifecycle.phases import HELD, BurstPhase
from gpupool.models.clusters import MICRO
from gpupool.models.schemas import BudgetLine
from gpupool.services.auth import Principal
from gpupool.store.burst_bills import billed, cost_fraction, gpu_seconds, month, rate_micro_per_s
from gpupool.store.tables import BurstNodeRow, QueueRow


@dataclass(frozen=True)
class Standing:
    """A department's month to `now`."""

    spent: float
    """Dollars billed from the month's start to now."""
    forecast: float
    """Dollars at this month's pace so far: spent × the month's length / its time elapsed (spent at its start)."""
    rate_per_hour: float
    """Dollars an hour its nodes not given back yet cost."""
    nodes: int
    """Nodes it holds: asked for, provisioning or ready."""


def _dollars(micro: Fraction) -> float:
    return math.ceil(micro) / MICRO


def standing(rows: Iterable[BurstNodeRow], now: float) -> Standing:
    """`rows`: the department's nodes billed this month to now (`month_rows`)."""
    nodes = list(rows)
    start, end = month(now)
    cost = cost_fraction(nodes, start, now)
    elapsed = Fraction(now) - Fraction(start)
    forecast = cost * (Fraction(end) - Fraction(start)) / elapsed if elapsed > 0 else cost
    return Standing(
        spent=_dollars(cost),
        forecast=_dollars(forecast),
        rate_per_hour=_dollars(rate_micro_per_s(nodes) * 3600),
        nodes=sum(1 for r in nodes if BurstPhase(r.phase) in HELD),
    )


def month_rows(session: Session, now: float, department: str | None = None) -> list[BurstNodeRow]:
    """The nodes billed this calendar month to now (all departments', or one's)."""
    return billed(session, month(now)[0], now, department)


def budget_lines(
    session: Session, who: Principal, start: float, end: float, now: float, burst_used: Mapping[str, float]
) -> list[BudgetLine]:
    """One line per department `who` sees that has a budget or a bill in [start, end), by name. `burst_used`: the
    dollars of burst usage in the period by department (all its projects', whoever reads the report)."""
    until = min(end, now)  # a node still held is billed to now, not to a period's end still to come
    in_period = billed(session, start, until) if until > start else []
    this_month = month_rows(session, now)
    departments = {q.name: q for q in session.scalars(select(QueueRow).where(QueueRow.kind == "department"))}
    parents = {i: parent for i, parent in session.execute(select(QueueRow.id, QueueRow.parent_id))}
    names = {n for n, q in departments.items() if q.burst_budget_micro is not None} | {r.department for r in in_period}
    lines: list[BudgetLine] = []
    for name in sorted(names):
        row = departments.get(name)
        if not (who.is_admin or (row is not None and who.sees_department(row.id, parents))):
            continue
        rented = [r for r in in_period if r.department == name]
        now_standing = standing((r for r in this_month if r.department == name), now)
        rented_cost = _dollars(cost_fraction(rented, start, until))
        gpu_hours = sum((gpu_seconds(r, start, until) for r in rented), Fraction(0)) / 3600
        budget = None if row is None or row.burst_budget_micro is None else row.burst_budget_micro / MICRO
        lines.append(
            BudgetLine(
                department=name,
                monthly_budget=budget,
                spent=now_standing.spent,
                forecast=now_standing.forecast,
                rate_per_hour=now_standing.rate_per_hour,
                rented_gpu_hours=round(float(gpu_hours), 6),
                rented_cost=rented_cost,
                unused_cost=round(max(0.0, rented_cost - burst_used.get(name, 0.0)), 4),
                refused=None if row is None else row.burst_refused,
            )
        )
    return lines
