"""Consolidate: move preemptible work off a node so a waiting workload fits, if every moved one fits elsewhere.

What moves is chosen as victims are (`victim_sets`): the fewest workloads, then the least work lost, then the
most recently started, on the node where that set is cheapest. A gang moves whole: all its members are
evicted and requeued as one, counted once with all its members' work lost, and it must find room for every
member elsewhere at once (not where its members leave room as they stop), as any moved workload must.

Opt-in (moving restarts the moved workloads). The moved workloads are evicted with reason
`consolidate` and requeued; this cycle checks that the rest of the cluster has room for each of them,
and the waiting workload is pipelined onto the node they leave.
"""

from __future__ import annotations

from collections.abc import Callable

from gpupool.core import explain, quota
from gpupool.core.actions.reclaim import _retryable
from gpupool.core.decision import Eviction, EvictReason
from gpupool.core.model import Placement, State
from gpupool.core.ordering import FairOrder
from gpupool.core.preemption.victim_sets import SetKey, set_key, victims_on
from gpupool.core.preemption.victims import past_min_runtime, victim_key, visit_window
from gpupool.core.session import Session
from gpupool.core.state import NodeState, WorkloadState


def consolidate(session: Session) -> None:
    state = session.state
    waiting = [ws for ws in session.waiting() if _retryable(session, ws) and ws.w.gang_size == 1]
    for attempts, ws in enumerate(FairOrder(session, waiting)):
        if attempts >= session.config.max_preemption_attempts:
            break
        moved = _try(session, ws)
        if moved:
            state.commit()
            session.stats["consolidated"] += moved
            session.pending[ws.idx] = explain.waiting(ws, moved)


def _try(session: Session, ws: WorkloadState) -> int:
    """Move the cheapest set (by the rule of victim sets) off the node where it is cheapest, trying nodes in
    that order until the moved workloads all find room elsewhere. Nodes looked at: the victim search's
    window of them, each with a set found within `victim_sets.SEARCH_STEPS`."""
    state = session.state
    req, models = ws.w.request, frozenset(ws.w.gpu_models)
    for group in session.placer.pools_of(ws):
        rows = session.placer.rows(group, _quota_allows(session, ws))
        if rows is None:
            continue
        options: list[tuple[tuple[SetKey, int], NodeState, list[WorkloadState]]] = []
        for i in visit_window(session, ws, rows):
            node = state.nodes[i]
            if not node.schedulable:
                continue
            ranked = node.ranked_residents(lambda j: victim_key(state.workloads[j]))
            movable = [state.workloads[j] for j in ranked if _movable(state.workloads[j], state.now)]
            chosen = victims_on(node, movable, req, models, ws.queue, state.now) if movable else None
            if chosen:
                options.append(((set_key(chosen, state.now), node.idx), node, chosen))
        options.sort(key=lambda o: o[0])
        for _, node, chosen in options:
            checkpoint = state.checkpoint()
            moved = _move_off(session, node, chosen, ws)
            if moved:
                return moved
            state.rollback(checkpoint)
    return 0


def _quota_allows(session: Session, ws: WorkloadState) -> Callable[[int], bool]:
    nominal = ws.w.request.nominal_milli() * ws.w.gang_size

    def ok(pool: int) -> bool:
        cpu, memory = ws.w.request.cpu_milli * ws.w.gang_size, ws.w.request.memory_mib * ws.w.gang_size
        return quota.check(session.state, ws.queue, pool, nominal, ws.w.preemptible, cpu, memory) is None

    return ok


def _movable(v: WorkloadState, now: float) -> bool:
    return v.state is State.RUNNING and not v.bound and v.w.preemptible and past_min_runtime(v, now)


def _move_off(session: Session, node: NodeState, chosen: list[WorkloadState], ws: WorkloadState) -> int:
    state, policy = session.state, session.placer.policy
    req, models = ws.w.request, frozenset(ws.w.gpu_models)
    for v in chosen:
        where = "another node" if v.w.gang_size == 1 else f"other nodes, all {v.w.gang_size} members together"
        message = f"moved to make room for {ws.w.named_for(v.w)}; it restarts on {where}"
        state.evict(v, Eviction(v.w.id, EvictReason.CONSOLIDATE, message, preemptor=ws.w.id))
    found = policy.evaluate(node, req, True, models, ws.queue) if node.fits_host(req, True) else None
    if found is None:
        return 0
    target = Placement(0, node.name, found[0])
    state.hold(ws, target)
    for v in chosen:
        spot = None
        for group in session.placer.pools_of(v):
            rows = session.placer.rows(group, _quota_allows(session, v))
            others = rows[rows != node.idx] if rows is not None else None
            spot = session.placer.place_in(v, others, pipelined=False) if others is not None and len(others) else None
            if spot is not None:
                break
        if spot is None:
            return 0
        for p in spot:
            state.hold(v, p)  # keep its new room from being counted twice
    state.unhold(ws, target)
    state.place(ws, (target,), pipelined=True)
    return len(chosen)
