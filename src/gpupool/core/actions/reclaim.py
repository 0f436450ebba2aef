"""Reclaim: a project below its fair share (or deserved quota) takes GPUs back from projects above theirs.

Only preemptible workloads of projects over their deserved quota are victims, whatever their priority.
A reclaim never leaves a victim project (or department) below its deserved quota, nor lifts the
reclaimer above its fair share.
"""

from __future__ import annotations

from collections.abc import Callable

from gpupool.core import explain
from gpupool.core.decision import EvictReason, PendingCode
from gpupool.core.ordering import FairOrder
from gpupool.core.preemption.victims import past_min_runtime, place_with_evictions
from gpupool.core.session import Session
from gpupool.core.state import WorkloadState

RETRYABLE = (PendingCode.NO_NODE_FITS, PendingCode.GANG_UNPLACEABLE, PendingCode.QUEUED_BEHIND)


def reclaim(session: Session) -> None:
    state = session.state
    failed: set[tuple[object, ...]] = set()
    attempts = 0
    deserved = _deserved(session)
    waiting = [ws for ws in session.waiting() if _retryable(session, ws)]
    for ws in FairOrder(session, waiting):
        if attempts >= session.config.max_preemption_attempts:
            break
        chain = state.tree.chain[ws.queue]
        nominal = ws.w.request.nominal_milli() * ws.w.gang_size
        entitled = [p for p in _pools(session, ws) if _within(session, chain, p, nominal, session.fair)]
        if not entitled:
            continue
        key = (ws.queue, ws.w.request, ws.w.pools, ws.w.gpu_models, ws.w.gang_size)
        if key in failed:
            continue
        attempts += 1
        by_quota = {p: _within(session, chain, p, nominal, deserved) for p in entitled}
        eligible, valid = _rules(session, ws, by_quota)
        message = f"reclaimed for {ws.w.id} of project {ws.w.project}, which is below its fair share"
        evicted = place_with_evictions(session, ws, eligible, valid, EvictReason.RECLAIM, message)
        if evicted is None:
            failed.add(key)
            continue
        state.commit()
        session.stats["reclaimed"] += evicted
        session.pending[ws.idx] = explain.waiting(ws, evicted)


def _retryable(session: Session, ws: WorkloadState) -> bool:
    reason = session.pending.get(ws.idx)
    return reason is None or reason.code in RETRYABLE


def _pools(session: Session, ws: WorkloadState) -> list[int]:
    return sorted({n.pool_idx for g in session.placer.groups(ws) for n in g})


def _deserved(session: Session) -> list[list[int]]:
    state = session.state
    return [[q.quota(p).deserved for p in state.pools] for q in state.tree.queues]


def _within(session: Session, chain: tuple[int, ...], p: int, nominal: int, bound: list[list[int]]) -> bool:
    return all(session.state.used[q][p] + nominal <= bound[q][p] for q in chain)


def _rules(
    session: Session, ws: WorkloadState, by_quota: dict[int, bool]
) -> tuple[Callable[[WorkloadState], bool], Callable[[], bool]]:
    """Victims: preemptible work of other projects, in pools where the reclaimer is entitled.

    Every queue that loses work (up to the common ancestor) stays at or above its deserved quota and
    was above its fair share, unless the reclaimer is within its own deserved quota (quota reclaim).
    The reclaimer and its ancestors end no higher than their fair share.
    """
    state = session.state
    chain = state.tree.chain[ws.queue]
    shared = set(chain)
    before = [list(state.used[q]) for q in chain]

    def eligible(v: WorkloadState) -> bool:
        p = v.pool_idx
        if v.queue == ws.queue or not v.w.preemptible or p not in by_quota:
            return False
        if not past_min_runtime(v, state.now):
            return False
        for q in state.tree.chain[v.queue]:
            if q in shared:
                continue
            used = state.used[q][p]
            if used - v.milli < state.tree.queues[q].quota(state.pools[p]).deserved:
                return False
            if not (used > session.fair[q][p] or by_quota[p]):
                return False
        return True

    def valid() -> bool:
        p = ws.pool_idx
        for i, q in enumerate(chain):
            now = state.used[q][p]
            if now > before[i][p] and now > session.fair[q][p]:
                return False
        return True

    return eligible, valid
