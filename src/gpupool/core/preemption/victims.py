"""Find the fewest, cheapest victims whose eviction lets a workload start, inside a transaction.

Each member is tried on every node: as is, or after evicting eligible residents cheapest first (lowest
priority, then most recently started), with the set then minimised by dropping any victim the member
does not need. The node with the cheapest set wins. Nothing is kept unless every member is placed and
the caller's final check passes: a preemptor never evicts anything it cannot then use.
"""

from __future__ import annotations

from collections.abc import Callable

from gpupool.core import quota
from gpupool.core.decision import Eviction, EvictReason
from gpupool.core.model import Placement, Request, State
from gpupool.core.session import Session
from gpupool.core.state import NodeState, WorkingState, WorkloadState

Eligible = Callable[[WorkloadState], bool]


def victim_key(v: WorkloadState) -> tuple[int, float, str]:
    return (v.w.priority, -(v.w.start_time or 0.0), v.w.id)


def past_min_runtime(v: WorkloadState, now: float) -> bool:
    started = v.w.start_time if v.w.start_time is not None else now
    return now - started >= v.w.min_runtime_s


def place_with_evictions(
    session: Session,
    ws: WorkloadState,
    eligible: Eligible,
    valid: Callable[[], bool],
    reason: EvictReason,
    message: str,
) -> int | None:
    """Evict and pipeline `ws` if some victim set lets it start; returns how many were evicted."""
    state = session.state
    for group in session.placer.groups(ws):
        checkpoint = state.checkpoint()
        evicted_before = len(state.evictions)
        placements = _place_members(session, ws, group, eligible, reason, message)
        if placements is not None:
            state.place(ws, placements, pipelined=True)
            if quota.check(state, ws.queue, ws.pool_idx, 0, ws.w.preemptible) is None and valid():
                return len(state.evictions) - evicted_before
        state.rollback(checkpoint)
    return None


def _place_members(
    session: Session, ws: WorkloadState, nodes: list[NodeState], eligible: Eligible, reason: EvictReason, message: str
) -> tuple[Placement, ...] | None:
    state = session.state
    req, models = ws.w.request, frozenset(ws.w.gpu_models)
    need = req.nominal_milli()
    placements: list[Placement] = []
    used_nodes: set[int] = set()
    for member in range(ws.w.gang_size):
        best: tuple[tuple[object, ...], NodeState, list[WorkloadState]] | None = None
        for node in nodes:
            if not node.schedulable:
                continue
            found = _fits(session, node, req, models)
            if found is not None:
                key: tuple[object, ...] = (0, 0, 0, 0, node.idx not in used_nodes, -found[1], node.idx)
                victims: list[WorkloadState] = []
            else:
                candidates = _candidates(state, node, eligible)
                if not candidates or not _enough(node, candidates, need):
                    continue
                chosen = _victims_on(session, node, candidates, eligible, req, models)
                if chosen is None:
                    continue
                key = (
                    1, max(v.w.priority for v in chosen), len(chosen), sum(v.milli for v in chosen),
                    node.idx not in used_nodes, 0.0, node.idx,
                )
                victims = chosen
            if best is None or key < best[0]:
                best = (key, node, victims)
        if best is None:
            return None
        _, node, victims = best
        for v in victims:
            state.evict(v, Eviction(v.w.id, reason, message, preemptor=ws.w.id))
        found = _fits(session, node, req, models)
        assert found is not None
        p = Placement(member, node.name, found[0])
        state.hold(ws, p)
        placements.append(p)
        used_nodes.add(node.idx)
    for p in placements:
        state.unhold(ws, p)
    return tuple(placements)


def _fits(session: Session, node: NodeState, req: Request, models: frozenset[str]) -> tuple[tuple, float] | None:  # type: ignore[type-arg]
    if not node.fits_host(req, True):
        return None
    return session.placer.policy.evaluate(node, req, True, models)


def _candidates(state: WorkingState, node: NodeState, eligible: Eligible) -> list[WorkloadState]:
    out = []
    for idx in node.residents:
        v = state.workloads[idx]
        if v.state is State.RUNNING and not v.bound and eligible(v):
            out.append(v)
    out.sort(key=victim_key)
    return out


def _enough(node: NodeState, candidates: list[WorkloadState], need: int) -> bool:
    """A cheap necessary condition: free GPU plus what the candidates hold here covers the request."""
    free = sum(1000 - d.used for d in node.devices if not d.whole)
    for v in candidates:
        for p in v.placements:
            if p.node == node.name:
                free += sum(s.milli for s in p.devices)
    return free >= need


def _victims_on(
    session: Session,
    node: NodeState,
    candidates: list[WorkloadState],
    eligible: Eligible,
    req: Request,
    models: frozenset[str],
) -> list[WorkloadState] | None:
    state = session.state
    base = state.checkpoint()
    chosen: list[WorkloadState] = []
    dummy = Eviction("", EvictReason.PREEMPT, "")
    fitted = False
    for v in candidates:
        if v.state is not State.RUNNING or not eligible(v):
            continue  # an earlier victim (a gang seen twice, or its project's floor) rules it out now
        state.evict(v, dummy)
        chosen.append(v)
        if _fits(session, node, req, models) is not None:
            fitted = True
            break
    state.rollback(base)
    if not fitted:
        return None
    for v in list(reversed(chosen)):
        trial = [c for c in chosen if c is not v]
        for c in trial:
            state.evict(c, dummy)
        if _fits(session, node, req, models) is not None:
            chosen = trial
        state.rollback(base)
    return chosen

