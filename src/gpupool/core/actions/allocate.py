"""Allocate: place waiting workloads on free capacity, projects taking turns by fair share.

A workload that does not fit now but fits once releasing workloads are gone is pipelined onto their
capacity, so nothing else takes what it waits for. A share that would fit only beside other projects'
shares, in a pool that does not share devices across projects, is told so (`explain.unshared`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import numpy as np

from gpupool.core import explain, quota
from gpupool.core.decision import Pending, PendingCode
from gpupool.core.model import GpuKind, Placement, State
from gpupool.core.ordering import FairOrder, workload_key
from gpupool.core.session import Session
from gpupool.core.state import ANY_PROJECT, WorkingState, WorkloadState

SETTLE = True
"""Reuse a class's reason rather than trying each of its workloads while nothing is placed (see
`_allocate_settling`); off only in the test that proves the decisions the same either way."""

REUSABLE = (
    PendingCode.NEVER_FITS,
    PendingCode.OVER_LIMIT,
    PendingCode.NONPREEMPTIBLE_OVER_DESERVED,
    PendingCode.NO_NODE_FITS,
    PendingCode.GANG_UNPLACEABLE,
    PendingCode.NO_SHAREABLE_DEVICE,
)
"""Reasons whose message depends only on the workload's class and the working state, never on its id."""


class Outcome(enum.Enum):
    PLACED = "placed"
    STUCK = "stuck"
    """Not placed, and no workload of its class can be placed later in this allocate: allocate only takes
    capacity and quota, never gives any back."""
    UNSURE = "unsure"
    """Not placed, but another placement could have passed (a memory request's exact quota)."""


def allocate(session: Session) -> None:
    state = session.state
    has_releasing = any(n.rel_cpu or n.rel_memory or any(d.rel for d in n.devices) for n in state.nodes)
    failed: set[tuple[object, ...]] = set()
    _claim_nominations(session, has_releasing)
    if SETTLE:
        order = _allocate_settling(session, failed, has_releasing)
    else:
        order = FairOrder(session, session.waiting())
        for ws in order:
            try_allocate(session, ws, failed, has_releasing)
    for idx, head in order.blocked.items():
        ws = state.workloads[idx]
        session.pending[idx] = Pending(
            ws.w.id,
            PendingCode.QUEUED_BEHIND,
            f"project {ws.w.project} is strict FIFO and its head {head.w.shown} is waiting",
        )


def _allocate_settling(session: Session, failed: set[tuple[object, ...]], has_releasing: bool) -> FairOrder:
    """The fair order, where a workload whose class was tried since the last placement reuses that try's
    reason (where the reason names no more than the class) instead of being tried: the working state is the
    same, so trying it would give the same. A project whose turn places nothing goes again (`FairOrder`), so
    once the cluster is full most of the order is a run of such reuses."""
    classes = session.classes()
    order = FairOrder(session, session.waiting())
    seen: dict[int, Pending] = {}
    """Class -> the reason its last try gave, since the last placement."""
    for ws in order:
        c = classes[ws.idx]
        reason = seen.get(c)
        if reason is not None:
            # The class's reason itself, naming the workload that gave it: explain_all gives each its own copy,
            # with the numbers it works out once per such reason.
            session.pending[ws.idx] = reason
            order.unchanged = True
            continue
        if _attempt(session, ws, failed, has_releasing) is Outcome.PLACED:
            seen.clear()
            continue
        order.unchanged = True
        reason = session.pending[ws.idx]
        if reason.code in REUSABLE:
            seen[c] = reason
    return order


def try_allocate(
    session: Session,
    ws: WorkloadState,
    failed: set[tuple[object, ...]],
    has_releasing: bool,
    only: set[int] | None = None,
) -> bool:
    return _attempt(session, ws, failed, has_releasing, only) is Outcome.PLACED


def _attempt(
    session: Session,
    ws: WorkloadState,
    failed: set[tuple[object, ...]],
    has_releasing: bool,
    only: set[int] | None = None,
) -> Outcome:
    state, placer, w = session.state, session.placer, ws.w
    if not placer.ever_fits(ws):
        session.pending[ws.idx] = explain.never_fits(ws)
        return Outcome.STUCK
    nominal = w.request.nominal_milli() * w.gang_size
    cpu, memory = w.request.cpu_milli * w.gang_size, w.request.memory_mib * w.gang_size
    verdicts = [quota.check(state, ws.queue, p, nominal, w.preemptible, cpu, memory) for p in range(len(state.pools))]
    candidate_pools = placer.candidate_pools(ws)
    if all(verdicts[p] is not None for p in candidate_pools):
        first = verdicts[min(candidate_pools, key=lambda p: _preference(ws, state.pools[p]))]
        assert first is not None
        session.pending[ws.idx] = Pending(w.id, first.code, first.message)
        return Outcome.STUCK

    def pool_ok(p: int) -> bool:
        return verdicts[p] is None

    # Failures are remembered by shape: for everyone's (`anyone`) where nothing fits even ignoring whose
    # shares a device holds, else for the project's own (`shape`, see `_tenant`).
    anyone = (
        w.request,
        w.pools,
        w.clusters,
        w.gpu_models,
        w.gang_size,
        tuple(v is None for v in verdicts),
        ANY_PROJECT,
    )
    shape = (*anyone[:-1], _tenant(state, ws))
    for pipelined in (False, True):
        if pipelined and not has_releasing:
            break
        if (shape, pipelined) in failed or (anyone, pipelined) in failed:
            continue
        placements = placer.place(ws, pipelined, pool_ok, only)
        if placements is None:
            failed.add((shape, pipelined))
            continue
        if w.request.gpu_memory_mib:
            verdict = _exact_quota(session, ws, placements)
            if verdict is not None:
                session.pending[ws.idx] = verdict
                return Outcome.UNSURE
        state.place(ws, placements, pipelined)
        state.commit()
        session.stats["bound" if not pipelined else "pipelined"] += 1
        if pipelined:
            session.pending[ws.idx] = explain.waiting(ws)
        return Outcome.PLACED
    if shape[-1] == ANY_PROJECT:
        session.pending[ws.idx] = explain.no_room(ws)
    else:
        session.pending[ws.idx] = _unshared(session, ws, pool_ok, only, anyone, failed, has_releasing)
    return Outcome.STUCK


def _tenant(state: WorkingState, ws: WorkloadState) -> int:
    """Whose shares a device may hold decides where `ws` fits: its project where that can matter (it asks
    for a share and some pool does not share devices across projects), else no one's."""
    if ws.w.request.kind in (GpuKind.FRACTION, GpuKind.MEMORY) and any(state.exclusive):
        return ws.queue
    return ANY_PROJECT


def _unshared(
    session: Session,
    ws: WorkloadState,
    pool_ok: Callable[[int], bool],
    only: set[int] | None,
    anyone: tuple[object, ...],
    failed: set[tuple[object, ...]],
    has_releasing: bool,
) -> Pending:
    """Why a share found no room: the share rule alone where it would fit if other projects' shares were no
    bar, else no room at all. Where nothing fits even so, nothing fits for any project: that is remembered
    (the cluster only fills up while allocate runs)."""
    for pipelined in (False, True) if has_releasing else (False,):
        if (anyone, pipelined) in failed:
            continue
        found = session.placer.place(ws, pipelined, pool_ok, only, share_rule=False)
        if found is not None:
            return explain.unshared(ws, session.state.node_by_name[found[0].node].pool)
        failed.add((anyone, pipelined))
    return explain.no_room(ws)


def _claim_nominations(session: Session, has_releasing: bool) -> None:
    """Workloads nominated last cycle (evictions were made for them) claim those nodes before anyone else.

    Without this, capacity released for them could go to whoever the fair order reaches first.
    """
    state = session.state
    nominated = [ws for ws in session.waiting() if ws.w.nominated_nodes]
    for ws in sorted(nominated, key=workload_key):
        only = {state.node_by_name[n].idx for n in ws.w.nominated_nodes if n in state.node_by_name}
        if only:
            try_allocate(session, ws, set(), has_releasing, only)
    # A workload moved to make room (reclaim with moves) is still stopping: its new room stays held for it
    # until it is pending again and claims it as above.
    if not has_releasing:
        return
    moving = [ws for ws in state.workloads if ws.state is State.RELEASING and ws.w.nominated_nodes]
    for ws in sorted(moving, key=workload_key):
        rows = sorted(state.node_by_name[n].idx for n in ws.w.nominated_nodes if n in state.node_by_name)
        spot = session.placer.place_in(ws, np.array(rows, dtype=np.int64), pipelined=True) if rows else None
        for p in spot or ():
            state.hold(ws, p)


def _exact_quota(session: Session, ws: WorkloadState, placements: tuple[Placement, ...]) -> Pending | None:
    """Memory requests count the share of the device they landed on, known only after placement."""
    state = session.state
    pool_idx = state.node_by_name[placements[0].node].pool_idx
    milli = sum(d.milli for p in placements for d in p.devices)
    w = ws.w
    cpu, memory = w.request.cpu_milli * w.gang_size, w.request.memory_mib * w.gang_size
    verdict = quota.check(state, ws.queue, pool_idx, milli, w.preemptible, cpu, memory)
    return None if verdict is None else Pending(ws.w.id, verdict.code, verdict.message)


def _preference(ws: WorkloadState, pool: str) -> tuple[int, str]:
    return (ws.w.pools.index(pool) if pool in ws.w.pools else len(ws.w.pools), pool)
