"""What changed among the workloads since a mark, and whether a row moved under a writer.

Every write of a workload row through the ORM stamps its `version` with `tables.next_version()`, a number that grows in
commit order for readers: on SQLite (one writer at a time) one more than the largest stamped so far, on PostgreSQL
the writing transaction's id. `mark()` gives the least version a write not yet visible can still get, so a reader
that keeps the mark from before a look finds everything written since with `version >= mark` (and, harmlessly,
some rows again). The version is also what a writer checks: `claim()` locks the rows it means to write for the
rest of its transaction, provided nobody wrote them since it read them.

Writes only the scheduler reads back (a queued workload's current reason and nominated nodes) go through
`note_waiting()` without a stamp: nobody else needs to see them as changes, and a cycle of 100,000 pending
workloads would otherwise read them all again."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Row, Table, bindparam, func, select, tuple_, update
from sqlalchemy.orm import Session

from gpupool.lifecycle.phases import LIVE, QUEUED
from gpupool.store.tables import WorkloadRow

WORKLOADS: Table = WorkloadRow.__table__  # type: ignore[assignment]  # declared as a FromClause
CHUNK = 500
"""Rows per statement where a statement names rows one by one (SQLite allows 32,766 parameters)."""


def mark(session: Session) -> int:
    """The least version a write this reader cannot see yet may stamp: read it before the rows it covers."""
    if session.get_bind().dialect.name == "postgresql":
        return int(session.execute(select(func.txid_snapshot_xmin(func.txid_current_snapshot()))).scalar_one())
    return int(session.execute(select(func.coalesce(func.max(WorkloadRow.version), 0))).scalar_one()) + 1


QUEUED_COLUMNS = (
    WorkloadRow.id, WorkloadRow.version, WorkloadRow.name, WorkloadRow.project_id, WorkloadRow.state,
    WorkloadRow.hold, WorkloadRow.stop_reason, WorkloadRow.gpus, WorkloadRow.gpu_milli, WorkloadRow.gpu_memory_mib,
    WorkloadRow.cpu_milli, WorkloadRow.memory_mib, WorkloadRow.priority, WorkloadRow.priority_class,
    WorkloadRow.preemptible, WorkloadRow.min_runtime_s, WorkloadRow.workers, WorkloadRow.pools, WorkloadRow.gpu_models,
    WorkloadRow.queued_at, WorkloadRow.started_at, WorkloadRow.nominated, WorkloadRow.reason_event,
    WorkloadRow.reason_code, WorkloadRow.reason_args, WorkloadRow.clusters,
)  # fmt: skip
"""What the scheduler reads of a queued workload: plain columns, no ORM object (there may be 100,000)."""


def scheduled_rows(session: Session, since: int | None) -> Sequence[Row[Any]]:
    """The rows the scheduler may look at (queued and not held, or live), as column tuples: all of them, or those
    written since a mark (whatever their state now: a row that left the queue must leave the view too)."""
    query = select(*QUEUED_COLUMNS)
    if since is None:
        query = query.where(WorkloadRow.state.in_(sorted(QUEUED | LIVE)), WorkloadRow.hold.is_(False))
    else:
        query = query.where(WorkloadRow.version >= since)
    return session.execute(query.order_by(WorkloadRow.id)).all()


def load_rows(session: Session, ids: Iterable[int]) -> list[WorkloadRow]:
    """Workload rows with their allocations, read afresh (over what the session already holds of them)."""
    wanted = sorted(set(ids))
    out: list[WorkloadRow] = []
    for at in range(0, len(wanted), CHUNK):
        query = select(WorkloadRow).where(WorkloadRow.id.in_(wanted[at : at + CHUNK])).order_by(WorkloadRow.id)
        out.extend(session.scalars(query.execution_options(populate_existing=True)))
    return out


def claim(session: Session, read: Mapping[int, int]) -> set[int]:
    """Of the rows read at these versions ({id: version}), those nobody wrote since: they stay locked for this
    transaction (PostgreSQL: their row locks; SQLite: its write lock), so no write lands between this check and
    the commit. Call it with autoflush off: a flush first would stamp the rows and nothing would match."""
    table = WORKLOADS
    pairs = sorted(read.items())
    claimed: set[int] = set()
    for at in range(0, len(pairs), CHUNK):
        stmt = (
            update(table)
            .where(tuple_(table.c.id, table.c.version).in_(pairs[at : at + CHUNK]))
            .values(version=table.c.version)
            .returning(table.c.id)
        )
        claimed.update(session.execute(stmt).scalars())
    return claimed


def versions(session: Session, ids: Iterable[int]) -> dict[int, int]:
    wanted = sorted(set(ids))
    out: dict[int, int] = {}
    for at in range(0, len(wanted), CHUNK):
        query = select(WorkloadRow.id, WorkloadRow.version).where(WorkloadRow.id.in_(wanted[at : at + CHUNK]))
        out.update({wid: int(v) for wid, v in session.execute(query)})
    return out


_WAITING = (
    update(WORKLOADS)
    .where(WORKLOADS.c.id == bindparam("wid"), WORKLOADS.c.version == bindparam("seen"))
    .values(
        reason_event=bindparam("reason_event"),
        reason_code=bindparam("reason_code"),
        reason_args=bindparam("reason_args"),
        nominated=bindparam("nominated"),
    )
)


def note_waiting(session: Session, notes: Sequence[Mapping[str, Any]]) -> None:
    """Writes queued workloads' reasons and nominations ({wid, seen, reason_event, reason_code, reason_args,
    nominated}), each only if the row is still at the version `seen`: a row written meanwhile keeps the other
    writer's values, and its new version brings it back to the reader."""
    for at in range(0, len(notes), 5_000):
        session.execute(_WAITING, list(notes[at : at + 5_000]))
