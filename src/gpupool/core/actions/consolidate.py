"""Consolidate: move preemptible work off a node so a waiting workload fits, if every moved one fits elsewhere.

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
from gpupool.core.preemption.victims import past_min_runtime, victim_key
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
    state = session.state
    for group in session.placer.pools_of(ws):
        rows = session.placer.rows(group, _quota_allows(session, ws))
        for node in [] if rows is None else [state.nodes[i] for i in rows.tolist()]:
            if not node.schedulable:
                continue
            movable = sorted(
                (state.workloads[i] for i in node.residents if _movable(state.workloads[i], state.now)),
                key=victim_key,
            )
            if not movable:
                continue
            checkpoint = state.checkpoint()
            moved = _move_off(session, node, movable, ws)
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
    if v.state is not State.RUNNING or v.bound or not v.w.preemptible:
        return False
    return v.w.gang_size == 1 and past_min_runtime(v, now)


def _move_off(session: Session, node: NodeState, movable: list[WorkloadState], ws: WorkloadState) -> int:
    state, policy = session.state, session.placer.policy
    req, models = ws.w.request, frozenset(ws.w.gpu_models)
    evicted: list[WorkloadState] = []
    message = f"moved to make room for {ws.w.shown}; it restarts on another node"
    for v in movable:
        state.evict(v, Eviction(v.w.id, EvictReason.CONSOLIDATE, message, preemptor=ws.w.id))
        evicted.append(v)
        if node.fits_host(req, True) and policy.evaluate(node, req, True, models, ws.queue) is not None:
            break
    else:
        return 0
    found = policy.evaluate(node, req, True, models, ws.queue)
    assert found is not None
    target = Placement(0, node.name, found[0])
    state.hold(ws, target)
    for v in evicted:
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
    return len(evicted)
