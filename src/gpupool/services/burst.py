"""When a department may burst: its wait threshold, its monthly budget, whether the budget is paced over the month
and whether work stops at it. Admins set them (a budget is money the organisation spends); whoever sees the
department reads them, with its spending this month (gpupool.services.burst_costs)."""

from __future__ import annotations

import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.models.clusters import MICRO, DepartmentBurstPublic, DepartmentBurstSet
from gpupool.services import audit, burst_costs
from gpupool.services.auth import Principal
from gpupool.services.errors import Invalid, NotFound
from gpupool.services.org import queue_named
from gpupool.store.tables import QueueRow

DEFAULT_AFTER_S = 1800.0
"""A department given a budget and no threshold bursts for work that has waited half an hour."""


def _public(session: Session, row: QueueRow, now: float) -> DepartmentBurstPublic:
    budget = None if row.burst_budget_micro is None else row.burst_budget_micro / MICRO
    month = burst_costs.standing(burst_costs.month_rows(session, now, row.name), now)
    return DepartmentBurstPublic(
        department=row.name, after_s=row.burst_after_s, monthly_budget=budget, paced=row.burst_paced,
        stop_at_budget=row.burst_stop_at_budget, spent=month.spent, forecast=month.forecast,
        rate_per_hour=month.rate_per_hour, nodes=month.nodes, refused=row.burst_refused,
    )  # fmt: skip


def _department(session: Session, who: Principal, name: str) -> QueueRow:
    """The department, where the caller sees it: its admins, and members of its projects (whether their waiting
    work may burst is theirs to know)."""
    row = queue_named(session, name, "department")
    parents = {i: parent for i, parent in session.execute(select(QueueRow.id, QueueRow.parent_id))}
    if not who.sees_department(row.id, parents):
        raise NotFound(f"no department named {name!r}")
    return row


def get(session: Session, who: Principal, name: str, now: float | None = None) -> DepartmentBurstPublic:
    """Its settings, and its spending this month to `now` (the server's clock) as burst_costs figures it."""
    return _public(session, _department(session, who, name), time.time() if now is None else now)


def set_burst(
    session: Session, who: Principal, name: str, body: DepartmentBurstSet, now: float | None = None
) -> DepartmentBurstPublic:
    """Both null turns bursting off; a budget alone takes the default threshold; a threshold alone is refused (a
    department never bursts without a budget). Pacing and the stop at the budget are kept whether it bursts or
    not (they apply once it does)."""
    audit.note(tenant=name, obj=f"department/{name}")
    row = _department(session, who, name)
    who.require_admin()
    if body.monthly_budget is None and body.after_s is not None:
        raise Invalid("a department bursts within a monthly budget: give one (0 stops it bursting)")
    if body.monthly_budget is None:
        row.burst_after_s, row.burst_budget_micro = None, None
    else:
        row.burst_after_s = DEFAULT_AFTER_S if body.after_s is None else body.after_s
        row.burst_budget_micro = round(body.monthly_budget * MICRO)
    row.burst_paced, row.burst_stop_at_budget = body.paced, body.stop_at_budget
    session.commit()
    return _public(session, row, time.time() if now is None else now)
