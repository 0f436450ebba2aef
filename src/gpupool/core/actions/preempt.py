"""Preempt: within one project, a waiting workload evicts running preemptible ones of strictly lower priority."""

from __future__ import annotations

from collections.abc import Callable

from gpupool.core import explain
from gpupool.core.actions.reclaim import _retryable
from gpupool.core.decision import EvictReason
from gpupool.core.model import State
from gpupool.core.ordering import FairOrder
from gpupool.core.preemption.victims import past_min_runtime, place_with_evictions
from gpupool.core.session import Session
from gpupool.core.state import WorkloadState


def preempt(session: Session) -> None:
    state = session.state
    failed: set[tuple[object, ...]] = set()
    attempts = 0
    lowest: dict[int, int] = {}
    for ws in state.workloads:
        if ws.w.preemptible and ws.state is State.RUNNING and not ws.bound:
            lowest[ws.queue] = min(lowest.get(ws.queue, ws.w.priority), ws.w.priority)
    waiting = [
        ws for ws in session.waiting() if _retryable(session, ws) and lowest.get(ws.queue, 1 << 30) < ws.w.priority
    ]
    for ws in FairOrder(session, waiting):
        if attempts >= session.config.max_preemption_attempts:
            break
        key = (ws.queue, ws.w.priority, ws.w.request, ws.w.pools, ws.w.gpu_models, ws.w.gang_size)
        if key in failed:
            continue
        attempts += 1
        eligible, valid = _rules(session, ws)
        message = f"preempted by {ws.w.shown}, a higher-priority workload of project {ws.w.project}"
        evicted = place_with_evictions(session, ws, [ws.queue], eligible, valid, EvictReason.PREEMPT, message)
        if evicted is None:
            failed.add(key)
            continue
        state.commit()
        session.stats["preempted"] += evicted
        session.pending[ws.idx] = explain.waiting(ws, evicted)


def _rules(session: Session, ws: WorkloadState) -> tuple[Callable[[WorkloadState], bool], Callable[[], bool]]:
    """Victims: same project, strictly lower priority, preemptible, past their minimum runtime.

    The swap may not lift the project past both its fair share and what it used before.
    """
    state, leaf = session.state, ws.queue
    before = list(state.used[leaf])

    def eligible(v: WorkloadState) -> bool:
        return v.queue == leaf and v.w.preemptible and v.w.priority < ws.w.priority and past_min_runtime(v, state.now)

    def valid() -> bool:
        p = ws.pool_idx
        return state.used[leaf][p] <= max(before[p], session.fair[leaf][p])

    return eligible, valid
