"""Find the fewest, cheapest victims whose eviction lets a workload start, inside a transaction.

Each member is tried on every node: as is, or after evicting eligible residents cheapest first (lowest
priority, then most recently started), with the set then minimised by dropping any victim the member
does not need. The node with the cheapest set wins. Nothing is kept unless every member is placed and
the caller's final check passes: a preemptor never evicts anything it cannot then use. In a pool that does
not share devices across projects, a member's share may use a device only if what stays on it once the
victims leave is all of its own project.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from gpupool.core import quota
from gpupool.core.decision import Eviction, EvictReason
from gpupool.core.model import MILLI, DeviceShare, Placement, Request, State
from gpupool.core.placement.index import IntArray
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
    victim_queues: Iterable[int],
    eligible: Eligible,
    valid: Callable[[], bool],
    reason: EvictReason,
    message: str,
) -> int | None:
    """Evict and pipeline `ws` if some victim set lets it start; returns how many were evicted.

    Victims come from `victim_queues` only (and must pass `eligible`), so only the nodes hosting their
    work are searched.
    """
    state = session.state
    hosts = session.hosts(victim_queues)  # may be empty: capacity already releasing can still take it
    for group in session.placer.pools_of(ws):
        rows = session.placer.rows(group, lambda p: True)
        if rows is None:
            continue
        checkpoint = state.checkpoint()
        evicted_before = len(state.evictions)

        def accepted() -> bool:
            return quota.check(state, ws.queue, ws.pool_idx, 0, ws.w.preemptible) is None and valid()

        hosting = np.intersect1d(rows, hosts, assume_unique=True)
        search = Search(rows, hosting, eligible, reason, message, accepted if ws.w.gang_size == 1 else None)
        placements = _place_members(session, ws, search)
        if placements is not None:
            state.place(ws, placements, pipelined=True)
            evicted = len(state.evictions) - evicted_before
            # Without evictions of its own it fits in capacity that earlier evictions of this cycle release
            # (allocate found no room before them): it is nominated there, as if it had evicted.
            if accepted():
                return evicted
        state.rollback(checkpoint)
    return None


@dataclass(frozen=True)
class Search:
    rows: IntArray
    """Nodes the workload may use."""
    hosts: IntArray
    """Those of them hosting work of the victim queues."""
    eligible: Eligible
    reason: EvictReason
    message: str
    accept: Callable[[], bool] | None = None
    """For a single member: the caller's final check, asked with the member in place, so that a victim set
    it would refuse (a department growing past its share, say) gives way to the next cheapest."""
    preemptor: str | None = None
    """Whom the evictions are for, when not the workload being placed (one moved to make room for it)."""


def _place_members(session: Session, ws: WorkloadState, search: Search) -> tuple[Placement, ...] | None:
    state = session.state
    placements: list[Placement] = []
    used_nodes: set[int] = set()
    for member in range(ws.w.gang_size):
        node = _plain_fit(session, search.rows, ws, used_nodes, distinct=ws.w.gang_size == 1)
        if node is None:
            node = evict_for(session, ws, search, used_nodes)
        if node is None:
            return None
        found = fits_on(session, node, ws)
        assert found is not None
        p = Placement(member, node.name, found[0])
        state.hold(ws, p)
        placements.append(p)
        used_nodes.add(node.idx)
    for p in placements:
        state.unhold(ws, p)
    return tuple(placements)


def evict_for(session: Session, ws: WorkloadState, search: Search, used_nodes: set[int]) -> NodeState | None:
    """Evict the cheapest victim set that makes room for one member, on the node where it is cheapest."""
    state = session.state
    req, models = ws.w.request, frozenset(ws.w.gpu_models)
    eligible = search.eligible
    options: list[tuple[tuple[int, int, int, bool, int], NodeState, list[WorkloadState]]] = []
    for i in visit_window(session, ws, search.hosts):
        node = state.nodes[i]
        if not node.schedulable:
            continue
        candidates = _candidates(state, node, eligible)
        if not candidates or not _may_free_enough(node, candidates, req):
            continue
        chosen = victims_on(node, candidates, req, models, ws.queue)
        if chosen is None:
            continue
        key = (
            max(v.w.priority for v in chosen),
            len(chosen),
            sum(v.milli for v in chosen),
            node.idx not in used_nodes,
            node.idx,
        )
        options.append((key, node, chosen))
        if len(options) >= session.config.victim_search_nodes:
            break  # bounded search: cheap sets turn up on the first candidate nodes in practice
    options.sort(key=lambda o: o[0])
    for _, node, chosen in options:
        checkpoint = state.checkpoint()
        for v in chosen:
            if v.state is not State.RUNNING or not eligible(v):
                break  # an earlier victim (its project's floor, a gang already taken) rules this one out now
            state.evict(v, Eviction(v.w.id, search.reason, search.message, preemptor=search.preemptor or ws.w.id))
        else:
            found = fits_on(session, node, ws)
            if found is not None and (search.accept is None or _accepts(session, ws, node, found[0], search.accept)):
                return node
        state.rollback(checkpoint)
    return None


def visit_window(session: Session, ws: WorkloadState, rows: IntArray) -> list[int]:
    """At most `victim_visit_nodes` of the rows, starting at a place that moves with the workload and the
    clock: bounded work per attempt on any cluster size, and over cycles every node gets its turn."""
    ids: list[int] = rows.tolist()
    visit = session.config.victim_visit_nodes
    if len(ids) <= visit:
        return ids
    start = (zlib.crc32(ws.w.id.encode()) + int(session.state.now)) % len(ids)
    return (ids[start:] + ids[:start])[:visit]


def _accepts(
    session: Session, ws: WorkloadState, node: NodeState, shares: tuple[DeviceShare, ...], accept: Callable[[], bool]
) -> bool:
    state = session.state
    checkpoint = state.checkpoint()
    state.place(ws, (Placement(0, node.name, shares),), pipelined=True)
    try:
        return accept()
    finally:
        state.rollback(checkpoint)


def _plain_fit(
    session: Session, rows: IntArray, ws: WorkloadState, used_nodes: set[int], distinct: bool
) -> NodeState | None:
    """The best node that takes the member without evictions (counting releasing capacity as free)."""
    req, models = ws.w.request, frozenset(ws.w.gpu_models)
    best: NodeState | None = None
    best_key: tuple[bool, float, int] | None = None
    for node in session.placer.fitting(rows, req, True, distinct, ws.queue):
        found = session.placer.policy.evaluate(node, req, True, models, ws.queue)
        if found is None:
            continue
        key = (node.idx in used_nodes, found[1], -node.idx)
        if best_key is None or key > best_key:
            best, best_key = node, key
    return best


def fits_on(session: Session, node: NodeState, ws: WorkloadState) -> tuple[tuple[DeviceShare, ...], float] | None:
    """Where one member of `ws` would go on `node` once releasing work is gone, and its score; None if nowhere."""
    req = ws.w.request
    if not node.could_host(req, True):
        return None
    return session.placer.policy.evaluate(node, req, True, frozenset(ws.w.gpu_models), ws.queue)


def _candidates(state: WorkingState, node: NodeState, eligible: Eligible) -> list[WorkloadState]:
    out = []
    for idx in node.ranked_residents(lambda i: victim_key(state.workloads[i])):
        v = state.workloads[idx]
        if v.state is State.RUNNING and not v.bound and eligible(v):
            out.append(v)
    return out


def _may_free_enough(node: NodeState, candidates: list[WorkloadState], req: Request) -> bool:
    """A cheap upper bound for whole-GPU requests: free devices, plus what candidates hold, plus shared ones."""
    if not req.gpus:
        return True
    whole_later, shared = node.summary()[1], node.shared_devices()
    held = sum(v.w.request.gpus * node.residents.get(v.idx, 0) for v in candidates)
    return whole_later + held + shared >= req.gpus


class _NodeModel:
    """Just enough of a node to ask 'does the member fit if these workloads leave?' without the journal."""

    __slots__ = ("cpu", "devices", "holders", "memory", "node", "project", "req")

    def __init__(self, node: NodeState, req: Request, models: frozenset[str], project: int) -> None:
        self.node, self.req, self.project = node, req, project
        self.cpu, self.memory = node.used_cpu, node.used_memory
        self.devices = {
            d.index: [d.used, d.used_mem, d.whole, d.memory] for d in node.devices if not models or d.model in models
        }
        self.holders: dict[int, dict[int, int]] = {}
        """Where the pool does not share devices across projects: device -> project -> shares it holds."""
        if node.exclusive and (req.gpu_milli or req.gpu_memory_mib):
            self.holders = {d.index: dict(d.holders) for d in node.devices if d.index in self.devices}

    def remove(self, v: WorkloadState, sign: int = 1) -> None:
        for p in v.placements:
            if p.node != self.node.name:
                continue
            self.cpu -= sign * v.w.request.cpu_milli
            self.memory -= sign * v.w.request.memory_mib
            for s in p.devices:
                d = self.devices.get(s.index)
                if d is not None:
                    d[0] -= sign * s.milli
                    d[1] -= sign * s.memory_mib
                    if v.w.request.gpus:
                        d[2] = sign < 0
                    elif s.index in self.holders:
                        held = self.holders[s.index]
                        held[v.queue] = held.get(v.queue, 0) - sign

    def admits(self, index: int) -> bool:
        """Whether the device's remaining shares are all of the member's project (where that matters)."""
        held = self.holders.get(index)
        return held is None or all(q == self.project or not n for q, n in held.items())

    def fits(self) -> bool:
        req, node = self.req, self.node
        if self.cpu + req.cpu_milli > node.cpu or self.memory + req.memory_mib > node.memory:
            return False
        if req.gpus:
            return sum(1 for d in self.devices.values() if d[0] == 0) >= req.gpus
        if req.gpu_milli or req.gpu_memory_mib:
            for index, (used, used_mem, whole, memory) in self.devices.items():
                milli, mem = req.share_on(memory)
                if not whole and used + milli <= MILLI and used_mem + mem <= memory and self.admits(index):
                    return True
            return False
        return True


def victims_on(
    node: NodeState, candidates: list[WorkloadState], req: Request, models: frozenset[str], project: int
) -> list[WorkloadState] | None:
    """Cheapest-first victims on `node` until a member of `project` fits, then minimised; None if even all do
    not do."""
    model = _NodeModel(node, req, models, project)
    chosen: list[WorkloadState] = []
    for v in candidates:
        model.remove(v)
        chosen.append(v)
        if model.fits():
            break
    else:
        return None
    for v in list(reversed(chosen)):
        model.remove(v, sign=-1)  # put it back: keep it only if the member still fits
        if model.fits():
            chosen.remove(v)
        else:
            model.remove(v)
    return chosen
