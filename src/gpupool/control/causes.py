"""Whom an eviction made room for, and where its victim ran, as the typed arguments its stop records beside the
core's sentence. A suspended notebook's owner is told from them who took its GPUs and where it waits to come
back (gpupool.services.reasons renders the notice); nothing parses the sentence."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.core import Decision, Workload
from gpupool.core.model import Snapshot
from gpupool.store.snapshot import row_id
from gpupool.store.tables import WorkloadRow

Cause = dict[str, str]
"""by (the preemptor's name, for a victim of its own project only: a tenant does not learn another's workload
names), by_priority (its priority class), by_project (its project), pool (where the victim ran)."""


def eviction_causes(session: Session, decision: Decision, snapshot: Snapshot) -> dict[str, Cause]:
    """Each evicted workload's cause, by the core's id for it. Reads the names of the preemptors its victims may
    be told, a few rows, and only in a cycle that evicts."""
    if not decision.evictions:
        return {}
    wanted = {e.workload for e in decision.evictions} | {e.preemptor for e in decision.evictions if e.preemptor}
    found: dict[str, Workload] = {w.id: w for w in snapshot.workloads if w.id in wanted}
    pools = {n.name: n.pool for n in snapshot.nodes}
    told: set[int] = set()
    for e in decision.evictions:
        victim, by = found.get(e.workload), found.get(e.preemptor or "")
        if victim is not None and by is not None and by.project == victim.project:
            told.add(row_id(by.id))
    names: dict[int, str] = {}
    if told:
        query = select(WorkloadRow.id, WorkloadRow.name).where(WorkloadRow.id.in_(sorted(told)))
        names = {int(wid): str(name) for wid, name in session.execute(query)}
    out: dict[str, Cause] = {}
    for e in decision.evictions:
        victim, by = found.get(e.workload), found.get(e.preemptor or "")
        cause: Cause = {}
        if by is not None:
            name = names.get(row_id(by.id)) if victim is not None and by.project == victim.project else None
            cause |= {"by": name} if name is not None else {}
            cause |= {"by_priority": by.priority_class, "by_project": by.project}
        if victim is not None and victim.placements and victim.placements[0].node in pools:
            cause["pool"] = pools[victim.placements[0].node]
        out[e.workload] = cause
    return out
