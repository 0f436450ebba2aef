"""A name's runs. A finished workload's name may be submitted again (submit, apply with another spec, rerun): each
is a new workload, a run of that name, the earlier ones kept as its history. Lists show a name once, as its newest
run, with how many it has had; each run has its number within its name (1 the first), so two are told apart."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from sqlalchemy import Select, and_, exists, select, tuple_
from sqlalchemy.orm import Session, aliased

from gpupool.store.tables import WorkloadRow

Q = TypeVar("Q", bound=Select[Any])

CHUNK = 200
"""(project, name) pairs per query: well under SQLite's and PostgreSQL's bound-parameter limits."""


def newest_only(query: Q) -> Q:
    """`query` (of workloads) keeping the newest run of each name: no later one of its name and project lives on
    (deleted runs do not count). One index probe a row (ix_workloads_project_name)."""
    later = aliased(WorkloadRow)
    return query.where(
        ~exists().where(
            and_(later.project_id == WorkloadRow.project_id, later.name == WorkloadRow.name, later.id > WorkloadRow.id,
                 later.deleted_at.is_(None))
        )
    )  # fmt: skip


def numbers(session: Session, rows: Sequence[WorkloadRow]) -> dict[int, tuple[int, int]]:
    """Each row's id → (its run number within its name, the runs its name has had), counting runs not deleted."""
    pairs = sorted({(r.project_id, r.name) for r in rows})
    ids: dict[tuple[int, str], list[int]] = {}
    for at in range(0, len(pairs), CHUNK):
        found = session.execute(
            select(WorkloadRow.project_id, WorkloadRow.name, WorkloadRow.id)
            .where(tuple_(WorkloadRow.project_id, WorkloadRow.name).in_(pairs[at : at + CHUNK]))
            .where(WorkloadRow.deleted_at.is_(None))
            .order_by(WorkloadRow.id)
        )
        for project_id, name, wid in found:
            ids.setdefault((project_id, name), []).append(wid)
    out: dict[int, tuple[int, int]] = {}
    for r in rows:
        runs = ids.get((r.project_id, r.name), [r.id])
        out[r.id] = (runs.index(r.id) + 1 if r.id in runs else len(runs), len(runs))
    return out
