"""Reclaim with moves: the last resort of a project taking back its deserved quota.

A workload owed GPUs may need a node that no set of victims can empty: every node also runs something that
may not be reclaimed (work of a project within its deserved quota, its own project's work). A workload
that needs a whole 8-GPU node would then wait until such work ends, however long that is. Here the
blocking work is moved instead: evicted and nominated at once for room elsewhere in its pool, room that is
free, being released, or freed by evicting one more victim the reclaimer may take. A moved workload
restarts, as under consolidation, but keeps its share: its project's usage does not change.

Bounds: only single workloads (not gangs) are placed this way, at most `MAX_MOVES` workloads move for one,
each of them a single preemptible workload past its minimum runtime; the nodes looked at are the same
bounded window as the victim search, and `max_move_attempts` bounds the attempts per cycle (0: no moves).
While a moved workload stops, allocate keeps its new room for it (see `allocate._claim_nominations`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from gpupool.core import quota
from gpupool.core.decision import Eviction, EvictReason, Pending, PendingCode
from gpupool.core.model import Placement, State
from gpupool.core.placement.index import IntArray
from gpupool.core.preemption.victim_sets import NodeModel, SetKey, greedy_set, set_key
from gpupool.core.preemption.victims import (
    Eligible,
    Search,
    evict_for,
    fits_on,
    past_min_runtime,
    victim_key,
    visit_window,
)
from gpupool.core.session import Session
from gpupool.core.state import NodeState, WorkloadState

MAX_MOVES = 2
"""Most workloads moved to make room for one."""

Option = tuple[tuple[int, int, int, SetKey, int], NodeState, list[WorkloadState], list[WorkloadState]]


def place_with_moves(
    session: Session,
    ws: WorkloadState,
    victim_queues: Iterable[int],
    eligible: Eligible,
    valid: Callable[[], bool],
    message: str,
    in_pool: Callable[[int], bool],
    no_room: set[object],
) -> tuple[int, int] | None:
    """Evict victims and move blockers so that `ws` starts on one node of a pool `in_pool` allows;
    returns how many were evicted, and how many of them move. `no_room` collects the shapes of moved
    workloads that found no room, for the caller to keep until its next commit."""
    state = session.state
    if ws.w.gang_size != 1:
        return None
    hosts = session.hosts(victim_queues)

    def accepted() -> bool:
        return quota.check(state, ws.queue, ws.pool_idx, 0, ws.w.preemptible) is None and valid()

    for group in session.placer.pools_of(ws):
        rows = session.placer.rows(group, in_pool)
        if rows is None:
            continue
        for _, node, chosen, moved in _options(session, ws, rows, eligible):
            checkpoint = state.checkpoint()
            before = len(state.evictions)
            if _carry_out(session, ws, node, chosen, moved, group, hosts, eligible, message, no_room) and accepted():
                for m in moved:
                    session.pending[m.idx] = Pending(
                        m.w.id, PendingCode.WAITING_FOR_EVICTIONS,
                        f"moved to make room for {ws.w.named_for(m.w)}; it restarts on {m.placements[0].node}",
                        nominated=m.placements,
                    )  # fmt: skip
                return len(state.evictions) - before, len(moved)
            state.rollback(checkpoint)
    return None


def _movable(v: WorkloadState, now: float) -> bool:
    return (
        v.state is State.RUNNING and not v.bound and v.w.preemptible and v.w.gang_size == 1
        and past_min_runtime(v, now)
    )  # fmt: skip


def _options(session: Session, ws: WorkloadState, rows: IntArray, eligible: Eligible) -> list[Option]:
    """Nodes where victims plus at most MAX_MOVES moved workloads make room: fewest moves first, then the
    lowest-priority and smallest, then the cheapest whole set (`victim_sets.set_key`)."""
    state, config = session.state, session.config
    req, models = ws.w.request, frozenset(ws.w.gpu_models)
    need = req.nominal_milli()
    options: list[Option] = []
    for i in visit_window(session, ws, rows):
        node = state.nodes[i]
        if not node.schedulable:
            continue
        residents = [state.workloads[j] for j in node.ranked_residents(lambda j: victim_key(state.workloads[j]))]
        victims = [v for v in residents if v.state is State.RUNNING and not v.bound and eligible(v)]
        taken = {v.idx for v in victims}
        movers = sorted(
            (v for v in residents if v.idx not in taken and _movable(v, state.now)),
            key=lambda v: (v.milli, victim_key(v)),
        )
        if not movers:
            continue
        # Victims before movers, so the fewest move; the rule of victim sets then ranks nodes alike.
        chosen = greedy_set(NodeModel(node, req, models, ws.queue), victims + movers)
        if chosen is None:
            continue
        moved = [v for v in chosen if v.idx not in taken]
        if not moved or len(moved) > MAX_MOVES or sum(v.milli for v in moved) >= need:
            continue  # moving as much as it needs elsewhere is no easier than placing it there
        key = (
            len(moved), max(v.w.priority for v in moved), sum(v.milli for v in moved),
            set_key(chosen, state.now), node.idx,
        )  # fmt: skip
        options.append((key, node, chosen, moved))
        if len(options) >= config.victim_search_nodes:
            break
    options.sort(key=lambda o: o[0])
    return options


def _carry_out(
    session: Session,
    ws: WorkloadState,
    node: NodeState,
    chosen: list[WorkloadState],
    moved: list[WorkloadState],
    group: list[tuple[int, IntArray]],
    hosts: IntArray,
    eligible: Eligible,
    message: str,
    no_room: set[object],
) -> bool:
    state = session.state
    moving = {v.idx for v in moved}
    for v in chosen:
        if v.state is not State.RUNNING:
            return False
        if v.idx in moving:
            note = (
                f"moved to make room for {ws.w.named_for(v.w)}, which its project is owed; it restarts on another node"
            )
            state.evict(v, Eviction(v.w.id, EvictReason.CONSOLIDATE, note, preemptor=ws.w.id))
        elif eligible(v):  # an earlier victim (its project's floor) may rule this one out now
            state.evict(v, Eviction(v.w.id, EvictReason.RECLAIM, message, preemptor=ws.w.id))
        else:
            return False
    found = fits_on(session, node, ws)
    if found is None:
        return False
    target = Placement(0, node.name, found[0])
    state.hold(ws, target)
    for m in moved:
        shape = (m.w.request, m.w.gpu_models, m.w.clusters, m.pool_idx)
        spot = None if shape in no_room else _room_for(session, ws, m, node, group, hosts, eligible, message)
        if spot is None:
            no_room.add(shape)  # the search is the costly part, and the same shape fails alike elsewhere
            return False
        state.place(m, spot, pipelined=True)  # nominated there, and its project charged again
        if quota.check(state, m.queue, m.pool_idx, 0, m.w.preemptible) is not None:
            return False  # a memory request charged differently on its new device, say
    state.unhold(ws, target)
    state.place(ws, (target,), pipelined=True)
    return True


def _room_for(
    session: Session,
    ws: WorkloadState,
    m: WorkloadState,
    node: NodeState,
    group: list[tuple[int, IntArray]],
    hosts: IntArray,
    eligible: Eligible,
    message: str,
) -> tuple[Placement, ...] | None:
    """Room for a moved workload elsewhere in its pool: free or releasing, else freed by one more victim set."""
    rows = session.placer.rows(group, lambda p: p == m.pool_idx)
    others = None if rows is None else rows[rows != node.idx]
    if others is not None and m.w.clusters:
        # The group is the preemptor's: it may reach clusters the moved workload does not accept.
        others = others[np.isin(others, session.placer.candidates(m))]
    if others is None or not len(others):
        return None
    spot = session.placer.place_in(m, others, pipelined=True)
    if spot is not None:
        return spot
    hosting = np.intersect1d(others, hosts, assume_unique=True)
    search = Search(others, hosting, eligible, EvictReason.RECLAIM, message, preemptor=ws.w.id)
    freed = evict_for(session, m, search, set())
    if freed is None:
        return None
    found = fits_on(session, freed, m)
    return None if found is None else (Placement(0, freed.name, found[0]),)
