"""Preempt: within one project, a waiting workload evicts running preemptible ones of strictly lower priority.

Evictions free quota as well as capacity: a workload its project's (or a department's) limit holds back
evicts its project's own lower-priority work to pass it (`quota_room`), as KAI-Scheduler and Kueue do.
Where its own work alone does not make room, the victim set may add other projects' borrowed work under the
rules of reclaim (`reclaim.mixed_rules`): only when the mix frees enough, never taking a borrower below its
deserved quota, nor the preemptor's project past its fair share.
"""

from __future__ import annotations

from collections.abc import Callable

from gpupool.core import explain
from gpupool.core.actions.reclaim import _retryable, mixed_rules
from gpupool.core.decision import EvictReason, Pending, PendingCode
from gpupool.core.model import State
from gpupool.core.ordering import FairOrder
from gpupool.core.preemption.quota_room import make_room
from gpupool.core.preemption.victims import Labels, past_min_runtime, place_with_evictions, victim_key
from gpupool.core.session import Session
from gpupool.core.state import WorkloadState


def preempt(session: Session) -> None:
    state = session.state
    failed: set[tuple[object, ...]] = set()
    attempts = mixed = 0
    lowest: dict[int, int] = {}
    own: dict[int, list[WorkloadState]] = {}
    for ws in state.workloads:
        if ws.w.preemptible and ws.state is State.RUNNING and not ws.bound:
            lowest[ws.queue] = min(lowest.get(ws.queue, ws.w.priority), ws.w.priority)
            own.setdefault(ws.queue, []).append(ws)
    waiting = [
        ws
        for ws in session.waiting()
        if (_retryable(session, ws) or _over_limit(session, ws)) and lowest.get(ws.queue, 1 << 30) < ws.w.priority
    ]
    for ws in FairOrder(session, waiting):
        if attempts >= session.config.max_preemption_attempts:
            break
        limited = _over_limit(session, ws)
        key = (
            ws.queue,
            ws.w.priority,
            ws.w.request,
            ws.w.pools,
            ws.w.clusters,
            ws.w.gpu_models,
            ws.w.gang_size,
            limited,
        )
        if key in failed:
            continue
        attempts += 1
        eligible, valid = _rules(session, ws)
        message = f"preempted by {ws.w.shown}, a higher-priority workload of project {ws.w.project}"
        if limited:
            under = f"{message}, to bring the project under its limit"
            prepare = _room_under_limit(session, ws, own.get(ws.queue, []), eligible, under)
            evicted = place_with_evictions(
                session, ws, [ws.queue], eligible, valid, EvictReason.PREEMPT, message, prepare=prepare
            )
        else:
            evicted = place_with_evictions(session, ws, [ws.queue], eligible, valid, EvictReason.PREEMPT, message)
            if evicted is None and mixed < session.config.max_mixed_attempts:
                mixed += 1  # what the cap leaves is tried in a later cycle, as with every attempt cap
                evicted = _mixed(session, ws, [v for v in own.get(ws.queue, ()) if eligible(v)], eligible, message)
        if evicted is None:
            failed.add(key)
            young = _young_blocker(session, ws, own.get(ws.queue, []), valid, message, limited)
            if young is not None:
                session.pending[ws.idx] = young
            continue
        state.commit()
        for e in state.evictions[len(state.evictions) - evicted :]:
            session.stats["preempted" if e.reason is EvictReason.PREEMPT else "reclaimed"] += 1
        session.pending[ws.idx] = explain.waiting(ws, evicted)


def _young_blocker(
    session: Session,
    ws: WorkloadState,
    own: list[WorkloadState],
    valid: Callable[[], bool],
    message: str,
    limited: bool,
) -> Pending | None:
    """Why a preemption that failed waits, where only minimum runtimes stood in its way: the same search with
    its project's young lower-priority work eligible too, undone; it names the victim protected longest."""
    state = session.state
    young = {
        v.w.id: v
        for v in own
        if v.state is State.RUNNING and not v.bound and v.w.priority < ws.w.priority
        and not past_min_runtime(v, state.now)
    }  # fmt: skip
    if not young:
        return None

    def any_age(v: WorkloadState) -> bool:
        return v.queue == ws.queue and v.w.preemptible and v.w.priority < ws.w.priority

    prepare = _room_under_limit(session, ws, own, any_age, message) if limited else None
    checkpoint, before = state.checkpoint(), len(state.evictions)
    evicted = place_with_evictions(
        session, ws, [ws.queue], any_age, valid, EvictReason.PREEMPT, message, prepare=prepare
    )
    protected = [young[e.workload] for e in state.evictions[before:] if e.workload in young] if evicted else []
    state.rollback(checkpoint)
    if not protected:
        return None
    v = max(protected, key=lambda v: (_until(v, state.now), v.w.id))
    return explain.min_runtime(ws, v, _until(v, state.now))


def _until(v: WorkloadState, now: float) -> float:
    return (now if v.w.start_time is None else v.w.start_time) + v.w.min_runtime_s


def _room_under_limit(
    session: Session,
    ws: WorkloadState,
    own: list[WorkloadState],
    eligible: Callable[[WorkloadState], bool],
    message: str,
) -> Callable[[int], bool]:
    def prepare(p: int) -> bool:
        return make_room(session.state, ws, p, own, eligible, victim_key, message)

    return prepare


def _over_limit(session: Session, ws: WorkloadState) -> bool:
    reason = session.pending.get(ws.idx)
    return reason is not None and reason.code is PendingCode.OVER_LIMIT


def _mixed(
    session: Session,
    ws: WorkloadState,
    mine: list[WorkloadState],
    own: Callable[[WorkloadState], bool],
    message: str,
) -> int | None:
    """Evict its project's own lower-priority work (`mine`, those `own` accepts) together with other projects'
    borrowed work."""
    held: dict[int, int] = {}
    for v in mine:
        held[v.pool_idx] = held.get(v.pool_idx, 0) + v.milli
    rules = mixed_rules(session, ws, held)
    if rules is None:
        return None
    queues, borrowed, valid, taken = rules

    def eligible(v: WorkloadState) -> bool:
        return own(v) if v.queue == ws.queue else borrowed(v)

    def labels(v: WorkloadState) -> tuple[EvictReason, str]:
        return (EvictReason.PREEMPT, message) if v.queue == ws.queue else (EvictReason.RECLAIM, taken)

    mix: Labels = labels
    state = session.state
    checkpoint = state.checkpoint()
    evicted = place_with_evictions(
        session, ws, [ws.queue, *queues], eligible, valid, EvictReason.PREEMPT, message, labels=mix
    )
    if evicted is not None and not any(e.reason is EvictReason.PREEMPT for e in state.evictions[-evicted:]):
        state.rollback(checkpoint)  # borrowed work alone: reclaim's business, under its own rules
        return None
    return evicted


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
