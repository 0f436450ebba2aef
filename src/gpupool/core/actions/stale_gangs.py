"""Stale gang eviction: a running gang that lost members gives back what its survivors hold."""

from __future__ import annotations

from gpupool.core.decision import Eviction, EvictReason
from gpupool.core.model import State
from gpupool.core.session import Session


def evict_stale_gangs(session: Session) -> None:
    state = session.state
    for ws in state.workloads:
        if ws.state is not State.RUNNING or ws.w.gang_size == 1:
            continue
        alive = sum(1 for p in ws.placements if p.node in state.node_by_name)
        if alive >= ws.w.gang_size:
            continue
        message = f"gang has {alive} of its {ws.w.gang_size} members left; torn down to be requeued whole"
        state.evict(ws, Eviction(ws.w.id, EvictReason.GANG_BROKEN, message))
        state.commit()
        session.stats["gangs_torn_down"] += 1
