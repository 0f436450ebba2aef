"""What rented (burst) nodes cost: each node is billed from its ask to its release (or now), at the price it was
asked at, and a department's spending over a period is the sum, in micro-dollars, rounded up once."""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import UTC, datetime
from fractions import Fraction

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from gpupool.store.tables import BurstNodeRow


def month(now: float) -> tuple[float, float]:
    """The budget period `now` falls in: its calendar month (UTC), as [start, end) Unix seconds."""
    at = datetime.fromtimestamp(now, UTC)
    start = at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
    return start.timestamp(), end.timestamp()


def gpu_seconds(row: BurstNodeRow, start: float, end: float) -> Fraction:
    """The node's GPU-seconds within [start, end)."""
    until = row.released_at if row.released_at is not None else end
    held = Fraction(min(until, end)) - Fraction(max(row.asked_at, start))
    return row.gpus * max(Fraction(0), held)


def cost_fraction(rows: Iterable[BurstNodeRow], start: float, end: float) -> Fraction:
    """Micro-dollars, exact: each node's GPU-hours in [start, end) at its price."""
    return sum((gpu_seconds(r, start, end) * r.price_micro / 3600 for r in rows), Fraction(0))


def spent_micro(rows: Iterable[BurstNodeRow], start: float, end: float) -> int:
    return math.ceil(cost_fraction(rows, start, end))


def rate_micro_per_s(rows: Iterable[BurstNodeRow]) -> Fraction:
    """What the nodes not yet given back cost per second together."""
    return sum((Fraction(r.gpus * r.price_micro, 3600) for r in rows if r.released_at is None), Fraction(0))


def billed(session: Session, start: float, end: float, department: str | None = None) -> list[BurstNodeRow]:
    """The nodes billed for some of [start, end): asked before its end, not released before its start."""
    query = select(BurstNodeRow).where(
        BurstNodeRow.asked_at < end, or_(BurstNodeRow.released_at.is_(None), BurstNodeRow.released_at > start)
    )
    if department is not None:
        query = query.where(BurstNodeRow.department == department)
    return list(session.scalars(query.order_by(BurstNodeRow.asked_at, BurstNodeRow.name)))
