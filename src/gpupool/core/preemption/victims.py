"""Find the cheapest victims whose eviction lets a workload start, inside a transaction.

Each member is tried on every node: as is, or after evicting a victim set found there (`victim_sets`: lowest
priority, then fewest workloads, then least work lost, then most recently started). The node whose set is
cheapest by that same rule wins. A gang's members are placed one after another, and the first member that
must evict tries each of its nodes in turn (at most `victim_search_nodes`; past the cheapest, only those
whose set could serve more than one member): the gang takes the cheapest whole victim set by the same
rule, so a victim gang whose eviction frees room for several members is counted once. Nothing is kept
unless every member is placed and the caller's final check passes: a preemptor never evicts anything it
cannot then use. In a pool that does not share devices across projects, a member's share may use a device
only if what stays on it once the victims leave is all of its own project.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from gpupool.core import quota
from gpupool.core.decision import Eviction, EvictReason
from gpupool.core.model import DeviceShare, Placement, Request, State
from gpupool.core.placement.index import IntArray
from gpupool.core.preemption.victim_sets import SetKey, set_key, started, victims_on
from gpupool.core.session import Session
from gpupool.core.state import NodeState, WorkingState, WorkloadState

Eligible = Callable[[WorkloadState], bool]
Labels = Callable[[WorkloadState], tuple[EvictReason, str]]
NodeKey = tuple[SetKey, bool, int]
"""A victim set on a node: `victim_sets.set_key`; among equal sets a gang's own nodes, then the first node."""


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
    labels: Labels | None = None,
    prepare: Callable[[int], bool] | None = None,
) -> int | None:
    """Evict and pipeline `ws` if some victim set lets it start; returns how many were evicted.

    Victims come from `victim_queues` only (and must pass `eligible`), so only the nodes hosting their
    work are searched. `labels` names each victim's reason and message where they differ (a set mixing
    preemption and reclaim). With `prepare`, each pool is tried on its own, after `prepare(pool)` has made
    room there first (under a limit, say); it returns False where it cannot.
    """
    state = session.state
    hosts = session.hosts(victim_queues)  # may be empty: capacity already releasing can still take it
    for group in session.placer.pools_of(ws):
        for only in [None] if prepare is None else [p for p, _ in group]:
            rows = session.placer.rows(group, _in_pool(only))
            if rows is None:
                continue
            checkpoint = state.checkpoint()
            evicted_before = len(state.evictions)
            if only is not None and prepare is not None and not prepare(only):
                state.rollback(checkpoint)
                continue
            hosting = np.intersect1d(rows, hosts, assume_unique=True)
            search = Search(rows, hosting, eligible, reason, message, labels=labels)
            if _attempt(session, ws, search, valid):
                return len(state.evictions) - evicted_before
            state.rollback(checkpoint)
    return None


def _in_pool(only: int | None) -> Callable[[int], bool]:
    return lambda p: only is None or p == only


def _attempt(session: Session, ws: WorkloadState, search: Search, valid: Callable[[], bool]) -> bool:
    """Place `ws` with the search's victims, pipelined, if the result passes its quotas and `valid`."""
    state = session.state

    def accepted() -> bool:
        return quota.check(state, ws.queue, ws.pool_idx, 0, ws.w.preemptible) is None and valid()

    if ws.w.gang_size == 1:
        search = dataclasses.replace(search, accept=accepted)
    placements = _place_members(session, ws, search)
    if placements is None:
        return False
    state.place(ws, placements, pipelined=True)
    # Without evictions of its own it fits in capacity that earlier evictions of this cycle release
    # (allocate found no room before them): it is nominated there, as if it had evicted.
    return accepted()


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
    labels: Labels | None = None
    """A victim's reason and message, where they are not `reason` and `message` for all."""

    def eviction(self, v: WorkloadState, ws: WorkloadState) -> Eviction:
        reason, message = (self.reason, self.message) if self.labels is None else self.labels(v)
        return Eviction(v.w.id, reason, message, preemptor=self.preemptor or ws.w.id)


def _place_members(session: Session, ws: WorkloadState, search: Search) -> tuple[Placement, ...] | None:
    if ws.w.gang_size == 1:
        return _place_with(session, ws, search, 0, [])[0]
    state = session.state
    # Whole sets compare by the rule; at a tie the earlier choice wins (its first node came first).
    best: tuple[SetKey, int] | None = None
    for choice in range(session.config.victim_search_nodes):
        checkpoint = state.checkpoint()
        victims: list[WorkloadState] = []
        placements, first = _place_with(session, ws, search, choice, victims)
        state.rollback(checkpoint)
        if placements is not None:
            key = set_key(victims, state.now)
            if best is None or key < best[0]:
                best = (key, choice)
            if first is None or len(first) == len(victims):
                break  # no member evicted, or only the first did: no later choice costs less
        if first is None:
            break  # the member that had to evict has no more nodes to offer
        # Later choices start from a set no cheaper than this one's first (the nodes come cheapest first),
        # and a gang's whole set holds its first: once that costs more than the best, none can do better.
        if best is not None and set_key(first, state.now) > best[0]:
            break
    # Member by member, a victim gang shows up only where it is the cheapest set on one node, and once a
    # member has taken a cheaper single its project may have no room left to lose the gang: each victim gang
    # is also weighed whole, evicted first with the members then placed (and evicting more if they must).
    whole: WorkloadState | None = None
    for g in _victim_gangs(session, ws, search):
        if best is not None and set_key([g], state.now) >= best[0]:
            continue  # a set holding it costs no less
        checkpoint = state.checkpoint()
        victims = [g]
        state.evict(g, search.eviction(g, ws))
        placements = _place_with(session, ws, search, 0, victims)[0]
        state.rollback(checkpoint)
        if placements is not None and (best is None or set_key(victims, state.now) < best[0]):
            best, whole = (set_key(victims, state.now), 0), g
    if best is None:
        return None
    if whole is not None:
        state.evict(whole, search.eviction(whole, ws))
    return _place_with(session, ws, search, best[1], [])[0]


def _victim_gangs(session: Session, ws: WorkloadState, search: Search) -> list[WorkloadState]:
    """The eligible gangs running on several of the search's nodes, cheapest first (at most
    `victim_search_nodes`)."""
    state, seen = session.state, set()
    gangs: list[WorkloadState] = []
    for i in visit_window(session, ws, search.hosts):
        for idx in state.nodes[i].residents:
            v = state.workloads[idx]
            if idx in seen or v.w.gang_size < 2 or v.state is not State.RUNNING or v.bound:
                continue
            seen.add(idx)
            if len({p.node for p in v.placements}) > 1 and search.eligible(v):
                gangs.append(v)
    gangs.sort(key=lambda g: (set_key([g], state.now), g.w.id))
    return gangs[: session.config.victim_search_nodes]


def _place_with(
    session: Session, ws: WorkloadState, search: Search, choice: int, victims: list[WorkloadState]
) -> tuple[tuple[Placement, ...] | None, list[WorkloadState] | None]:
    """Place every member, the first one that must evict doing so on its `choice`-th cheapest node. Collects
    the victims; also returns those of that first member (None if no member evicts or it found no node)."""
    state = session.state
    placements: list[Placement] = []
    used_nodes: set[int] = set()
    first: list[WorkloadState] | None = None
    for member in range(ws.w.gang_size):
        branching = False
        node = _plain_fit(session, search.rows, ws, used_nodes, distinct=ws.w.gang_size == 1)
        if node is None:
            before = len(victims)
            node = _evict_for(session, ws, search, used_nodes, choice if first is None else 0, victims)
            if first is None:
                if node is None:
                    return None, None
                first, branching = victims[before:], choice > 0
        if node is None:
            return None, first
        found = fits_on(session, node, ws)
        assert found is not None
        p = Placement(member, node.name, found[0])
        state.hold(ws, p)
        placements.append(p)
        used_nodes.add(node.idx)
        if branching and not _serves_more(session, ws, node, first or []):
            return None, first
    for p in placements:
        state.unhold(ws, p)
    return tuple(placements), first


def _serves_more(session: Session, ws: WorkloadState, node: NodeState, victims: list[WorkloadState]) -> bool:
    """Whether evicting `victims` for one member on `node` could spare another member an eviction: they run on
    other nodes too, or `node` has room for one more member. A gang tries a costlier first set only then."""
    return any(p.node != node.name for v in victims for p in v.placements) or fits_on(session, node, ws) is not None


def evict_for(session: Session, ws: WorkloadState, search: Search, used_nodes: set[int]) -> NodeState | None:
    """Evict the cheapest victim set that makes room for one member, on the node where it is cheapest."""
    return _evict_for(session, ws, search, used_nodes, 0, [])


def _evict_for(
    session: Session,
    ws: WorkloadState,
    search: Search,
    used_nodes: set[int],
    skip: int,
    victims: list[WorkloadState],
) -> NodeState | None:
    """`evict_for`, passing over the `skip` cheapest nodes; adds the victims to `victims`."""
    state = session.state
    req, models = ws.w.request, frozenset(ws.w.gpu_models)
    eligible = search.eligible
    # Nodes are searched in the order of their first preemptible workload (lowest priority, then most recently
    # started), so that the bounded search sees the sets the rule prefers wherever they run, not those of the
    # first nodes. Whether it is a victim is left to the search: asking costs more than the search saves.
    nodes: list[tuple[tuple[int, float, int], NodeState]] = []
    for i in visit_window(session, ws, search.hosts):
        node = state.nodes[i]
        if node.schedulable:
            first = _first_preemptible(state, node)
            if first is not None:
                nodes.append(((first.w.priority, -started(first, state.now), i), node))
    nodes.sort(key=lambda n: n[0])
    options: list[tuple[NodeKey, NodeState, list[WorkloadState], list[WorkloadState]]] = []
    for _, node in nodes:
        if len(options) >= session.config.victim_search_nodes:
            break  # bounded search: cheap sets turn up on the nodes of the cheapest first victims in practice
        candidates = _candidates(state, node, eligible)
        if not candidates or not _may_free_enough(node, candidates, req):
            continue
        chosen = victims_on(node, candidates, req, models, ws.queue, state.now)
        if chosen is None:
            continue
        # The same rule as on one node; at a tie, a gang's members keep to the nodes it already uses.
        options.append(((set_key(chosen, state.now), node.idx not in used_nodes, node.idx), node, chosen, candidates))
    options.sort(key=lambda o: o[0])
    for _, node, chosen, candidates in options[skip:]:
        checkpoint = state.checkpoint()
        if not _evict_all(state, ws, search, chosen):
            # An earlier victim (its project's floor, a gang already taken) rules a later one out: the set
            # victims_on found, blind to quotas, breaks a rule. Take them one by one in order instead, each
            # while it is still eligible, until the member fits.
            state.rollback(checkpoint)
            chosen = _one_by_one(session, ws, search, node, candidates)
        if chosen:
            found = fits_on(session, node, ws)
            if found is not None and (search.accept is None or _accepts(session, ws, node, found[0], search.accept)):
                victims.extend(chosen)
                return node
        state.rollback(checkpoint)
    return None


def _evict_all(state: WorkingState, ws: WorkloadState, search: Search, chosen: list[WorkloadState]) -> bool:
    for v in chosen:
        if v.state is not State.RUNNING or not search.eligible(v):
            return False
        state.evict(v, search.eviction(v, ws))
    return True


def _one_by_one(
    session: Session, ws: WorkloadState, search: Search, node: NodeState, candidates: list[WorkloadState]
) -> list[WorkloadState]:
    """Candidates in victim order, each evicted if still eligible, until the member fits; empty if it never
    does (what was evicted stays for the caller to roll back)."""
    chosen: list[WorkloadState] = []
    for v in candidates:
        if v.state is not State.RUNNING or not search.eligible(v):
            continue
        session.state.evict(v, search.eviction(v, ws))
        chosen.append(v)
        if fits_on(session, node, ws) is not None:
            return chosen
    return []


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


def _first_preemptible(state: WorkingState, node: NodeState) -> WorkloadState | None:
    for idx in node.ranked_residents(lambda i: victim_key(state.workloads[i])):
        v = state.workloads[idx]
        if v.state is State.RUNNING and not v.bound and v.w.preemptible:
            return v
    return None


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
