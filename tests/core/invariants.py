"""Invariants every scheduling cycle must keep, checked against snapshots and decisions from outside the core.

Everything here is recomputed from the public model (placements, quotas, the decision), never read from the
core's working state, so a bookkeeping bug in the core cannot hide itself.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable

from gpupool.core import (
    MILLI,
    Decision,
    EvictReason,
    Node,
    PendingCode,
    Placement,
    Queue,
    Snapshot,
    State,
    Workload,
)
from gpupool.core.model import GpuKind

Usage = dict[tuple[str, str], int]
"""(queue, pool) -> milli-GPU, a queue counting its descendants."""


def chain(queues: Iterable[Queue], name: str) -> list[str]:
    """The queue itself, then its ancestors up to the root."""
    by_name = {q.name: q for q in queues}
    out = [name]
    parent = by_name[name].parent
    while parent is not None:
        out.append(parent)
        parent = by_name[parent].parent
    return out


def node_pools(snapshot: Snapshot) -> dict[str, str]:
    return {n.name: n.pool for n in snapshot.nodes}


def pool_of(snapshot: Snapshot, placements: tuple[Placement, ...]) -> str | None:
    pools = node_pools(snapshot)
    return pools.get(placements[0].node) if placements else None


def held_milli(placements: Iterable[Placement]) -> int:
    return sum(d.milli for p in placements for d in p.devices)


def usage_of(
    snapshot: Snapshot, placed: Iterable[tuple[Workload, tuple[Placement, ...]]], nonpreemptible_only: bool = False
) -> Usage:
    """Usage per (queue, pool) of the given (workload, placements) pairs, charged up each queue's chain."""
    known = {q.name for q in snapshot.queues}
    out: Usage = defaultdict(int)
    for w, placements in placed:
        if w.project not in known or (nonpreemptible_only and w.preemptible):
            continue
        pool = pool_of(snapshot, placements)
        if pool is None:
            continue
        for q in chain(snapshot.queues, w.project):
            out[q, pool] += held_milli(placements)
    return out


def running(snapshot: Snapshot) -> list[Workload]:
    return [w for w in snapshot.workloads if w.state is State.RUNNING]


def usage(snapshot: Snapshot, nonpreemptible_only: bool = False) -> Usage:
    return usage_of(snapshot, ((w, w.placements) for w in running(snapshot)), nonpreemptible_only)


# -- 1. capacity -------------------------------------------------------------------------------------------------


def check_capacity(snapshot: Snapshot) -> None:
    nodes = {n.name: n for n in snapshot.nodes}
    milli: Counter[tuple[str, int]] = Counter()
    memory: Counter[tuple[str, int]] = Counter()
    whole: Counter[tuple[str, int]] = Counter()
    shared: Counter[tuple[str, int]] = Counter()
    cpu: Counter[str] = Counter()
    mem: Counter[str] = Counter()
    for w in running(snapshot):
        for p in w.placements:
            assert p.node in nodes, f"{w.id} placed on unknown node {p.node}"
            cpu[p.node] += w.request.cpu_milli
            mem[p.node] += w.request.memory_mib
            for d in p.devices:
                key = (p.node, d.index)
                milli[key] += d.milli
                memory[key] += d.memory_mib
                if w.request.kind is GpuKind.WHOLE:
                    whole[key] += 1
                else:
                    shared[key] += 1
    for name, node in nodes.items():
        assert cpu[name] <= node.cpu_milli, f"node {name} CPU {cpu[name]} > {node.cpu_milli}"
        assert mem[name] <= node.memory_mib, f"node {name} memory {mem[name]} > {node.memory_mib}"
        for dev in node.devices:
            key = (name, dev.index)
            assert milli[key] <= MILLI, f"device {key} holds {milli[key]} milli"
            assert memory[key] <= dev.memory_mib, f"device {key} holds {memory[key]} MiB > {dev.memory_mib}"
            assert whole[key] <= 1, f"device {key} has {whole[key]} whole allocations"
            assert not (whole[key] and shared[key]), f"device {key} is both whole and shared"
    for key in milli:
        assert key[1] in {d.index for d in nodes[key[0]].devices}, f"no device {key}"


# -- 2, 3. quotas ------------------------------------------------------------------------------------------------


def pools_of(snapshot: Snapshot) -> list[str]:
    return sorted({n.pool for n in snapshot.nodes})


def check_quotas(snapshot: Snapshot) -> None:
    used = usage(snapshot)
    np_used = usage(snapshot, nonpreemptible_only=True)
    for q in snapshot.queues:
        for pool in pools_of(snapshot):
            quota = q.quota(pool)
            if quota.limit is not None:
                assert used[q.name, pool] <= quota.limit, (
                    f"{q.name} uses {used[q.name, pool]} in {pool}, over its limit {quota.limit}"
                )
            assert np_used[q.name, pool] <= quota.deserved, (
                f"{q.name} runs {np_used[q.name, pool]} non-preemptible in {pool}, over deserved {quota.deserved}"
            )


# -- 5. placements -----------------------------------------------------------------------------------------------


def check_placements(snapshot: Snapshot, w: Workload, placements: tuple[Placement, ...]) -> None:
    nodes: dict[str, Node] = {n.name: n for n in snapshot.nodes}
    assert len(placements) == w.gang_size, f"{w.id}: {len(placements)} placements for a gang of {w.gang_size}"
    assert sorted(p.member for p in placements) == list(range(w.gang_size)), f"{w.id}: members {placements}"
    assert len({nodes[p.node].pool for p in placements}) == 1, f"{w.id}: gang spans pools"
    req = w.request
    for p in placements:
        node = nodes[p.node]
        if w.pools:
            assert node.pool in w.pools, f"{w.id} wants pools {w.pools}, placed in {node.pool}"
        models = {d.index: d for d in node.devices}
        indices = [d.index for d in p.devices]
        assert len(set(indices)) == len(indices), f"{w.id}: a device twice in one placement"
        for d in p.devices:
            dev = models[d.index]
            if w.gpu_models:
                assert dev.model in w.gpu_models, f"{w.id} wants {w.gpu_models}, got {dev.model}"
        kind = req.kind
        if kind is GpuKind.WHOLE:
            assert len(p.devices) == req.gpus, f"{w.id}: {len(p.devices)} devices for {req.gpus} GPUs"
            assert all(d.milli == MILLI for d in p.devices), f"{w.id}: a whole GPU not at 1000 milli"
        elif kind is GpuKind.NONE:
            assert p.devices == (), f"{w.id}: a CPU-only workload holds devices"
        else:
            assert len(p.devices) == 1, f"{w.id}: a share spans {len(p.devices)} devices"
            d = p.devices[0]
            expected = req.share_on(models[d.index].memory_mib)
            assert (d.milli, d.memory_mib) == expected, f"{w.id}: share {d} != {expected}"


def check_running(snapshot: Snapshot) -> None:
    for w in running(snapshot):
        check_placements(snapshot, w, w.placements)


# -- 4, 6, 7. the decision against the snapshot it was made from ---------------------------------------------------


def past_min_runtime(w: Workload, now: float) -> bool:
    started = w.start_time if w.start_time is not None else now
    return now - started >= w.min_runtime_s


def guaranteed(before: Snapshot, used_before: Usage, queue: str, pool: str, cap: bool = True) -> int:
    """What `queue` uses in `pool` within deserved quotas: each project counted up to its own deserved
    quota, each department below `queue` up to its own."""
    kids = [q.name for q in before.queues if q.parent == queue]
    total = sum(guaranteed(before, used_before, k, pool) for k in kids) if kids else used_before[queue, pool]
    deserved = next(q for q in before.queues if q.name == queue).quota(pool).deserved
    return min(total, deserved) if cap or not kids else total


def owed(before: Snapshot, used_before: Usage, pre: Workload, victim: Workload) -> bool:
    """Whether `pre` reclaims within its deserved quota, and within its departments' where they grow (which
    a minimum runtime does not delay). A department's room counts what its projects use up to their own
    deserved quotas: what siblings borrow beyond theirs does not void a project's guarantee."""
    pool = pool_of(before, victim.placements)
    if pool is None or pre.project == victim.project:
        return False
    queues = {q.name: q for q in before.queues}
    need = pre.request.nominal_milli() * pre.gang_size
    theirs = set(chain(before.queues, victim.project))
    if used_before[pre.project, pool] + need > queues[pre.project].quota(pool).deserved:
        return False
    return all(
        guaranteed(before, used_before, q, pool, cap=False) + need <= queues[q].quota(pool).deserved
        for q in chain(before.queues, pre.project)[1:]
        if q not in theirs
    )


# -- 8. devices shared across projects -------------------------------------------------------------------------------

Holders = dict[tuple[str, int], set[str]]
"""(node, device index) -> projects holding shares of it."""


def _hold(holders: Holders, w: Workload, placements: Iterable[Placement]) -> None:
    if w.request.kind in (GpuKind.FRACTION, GpuKind.MEMORY):
        for p in placements:
            for d in p.devices:
                holders[p.node, d.index].add(w.project)


def shared_across_projects(snapshot: Snapshot) -> list[tuple[str, int]]:
    """Devices whose running shares belong to more than one project, in pools that do not allow it."""
    holders: Holders = defaultdict(set)
    for w in running(snapshot):
        _hold(holders, w, w.placements)
    pools = node_pools(snapshot)
    return sorted(
        key for key, projects in holders.items()
        if len(projects) > 1 and not snapshot.pool(pools[key[0]]).share_across_projects
    )  # fmt: skip


def check_share_policy(before: Snapshot, decision: Decision) -> None:
    """No share is placed beside another project's on a device of a pool that does not allow it. A bind
    starts now: beside what holds the device now (releasing and just-evicted work included) and, later, what
    is nominated there. A nominated placement starts once evictions finish: beside what stays."""
    by_id = {w.id: w for w in before.workloads}
    evicted = {e.workload for e in decision.evictions}
    now: Holders = defaultdict(set)
    later: Holders = defaultdict(set)
    for w in before.workloads:
        if w.state in (State.RUNNING, State.RELEASING):
            _hold(now, w, w.placements)
        if w.state is State.RUNNING and w.id not in evicted:
            _hold(later, w, w.placements)
    placed = [(by_id[b.workload], b.placements, True) for b in decision.binds]
    placed += [(by_id[p.workload], p.nominated, False) for p in decision.pending if p.nominated and p.workload in by_id]
    for w, placements, starts_now in placed:
        if starts_now:
            _hold(now, w, placements)
        _hold(later, w, placements)
    pools = node_pools(before)
    for w, placements, starts_now in placed:
        for p in placements:
            if before.pool(pools[p.node]).share_across_projects:
                continue
            for d in p.devices if w.request.kind in (GpuKind.FRACTION, GpuKind.MEMORY) else ():
                others = (later[p.node, d.index] | (now[p.node, d.index] if starts_now else set())) - {w.project}
                assert not others, (
                    f"{w.id} of {w.project} {'bound' if starts_now else 'nominated'} to device {d.index} of "
                    f"{p.node} beside shares of {sorted(others)}; pool {pools[p.node]} does not share across projects"
                )


def check_decision(before: Snapshot, decision: Decision) -> None:
    by_id = {w.id: w for w in before.workloads}
    evicted = [e.workload for e in decision.evictions]
    assert len(set(evicted)) == len(evicted), f"evicted twice: {evicted}"
    used_before = usage(before)
    # Reclaim runs after this cycle's allocate: a project its binds took past its deserved quota is over it then.
    bound_now = usage_of(before, ((by_id[b.workload], b.placements) for b in decision.binds))
    nodes = {n.name: n for n in before.nodes}
    for e in decision.evictions:
        v = by_id[e.workload]
        assert v.state is State.RUNNING, f"evicted {v.id} was {v.state.value}"
        if e.reason is EvictReason.GANG_BROKEN:
            continue
        assert v.preemptible, f"{e.reason.value} evicted non-preemptible {v.id}"
        assert e.preemptor is not None and e.preemptor in by_id, f"eviction of {v.id} names no preemptor"
        pre = by_id[e.preemptor]
        assert past_min_runtime(v, before.now) or owed(before, used_before, pre, v), (
            f"{e.reason.value} evicted {v.id} before its min runtime"
        )
        if e.reason is EvictReason.PREEMPT:
            assert pre.project == v.project, f"preempt across projects: {pre.id} ({pre.project}) -> {v.id}"
            assert pre.priority > v.priority, f"preempt by {pre.id} ({pre.priority}) of {v.id} ({v.priority})"
        elif e.reason is EvictReason.RECLAIM:
            assert pre.project != v.project, f"reclaim within project {v.project}: {pre.id} -> {v.id}"
            pool = pool_of(before, v.placements)
            assert pool is not None
            deserved = next(q for q in before.queues if q.name == v.project).quota(pool).deserved
            used = used_before[v.project, pool] + bound_now[v.project, pool]
            assert used > deserved, f"reclaimed {v.id} from {v.project}, using {used} of deserved {deserved}"
    bound = [b.workload for b in decision.binds]
    assert len(set(bound)) == len(bound), f"bound twice: {bound}"
    assert not set(bound) & set(evicted), f"bound and evicted: {set(bound) & set(evicted)}"
    for b in decision.binds:
        w = by_id[b.workload]
        assert w.state is State.PENDING, f"bound {w.id} was {w.state.value}"
        check_placements(before, w, b.placements)
        assert all(nodes[p.node].schedulable for p in b.placements), f"{w.id} bound to an unschedulable node"
    pending = {p.workload for p in decision.pending}
    assert not pending & set(bound), f"both bound and pending: {pending & set(bound)}"
    for w in before.workloads:
        if w.state is State.PENDING:
            assert w.id in pending or w.id in bound, f"{w.id} left pending with no reason"
    check_shares(before, decision)
    check_share_policy(before, decision)


def check_shares(before: Snapshot, decision: Decision) -> None:
    """`shares` report usage after the cycle: what still runs, plus binds and pipelined (nominated) placements."""
    by_id = {w.id: w for w in before.workloads}
    evicted = {e.workload for e in decision.evictions}
    placed: list[tuple[Workload, tuple[Placement, ...]]] = [
        (w, w.placements) for w in running(before) if w.id not in evicted
    ]
    placed += [(by_id[b.workload], b.placements) for b in decision.binds]
    placed += [
        (by_id[p.workload], p.nominated)
        for p in decision.pending
        if p.code is PendingCode.WAITING_FOR_EVICTIONS and p.workload in by_id
    ]
    expected = usage_of(before, placed)
    seen = set()
    for s in decision.shares:
        seen.add((s.queue, s.pool))
        q = next(q for q in before.queues if q.name == s.queue)
        assert s.allocated == expected[s.queue, s.pool], (
            f"shares say {s.queue} holds {s.allocated} in {s.pool}; placements say {expected[s.queue, s.pool]}"
        )
        assert (s.deserved, s.limit) == (q.quota(s.pool).deserved, q.quota(s.pool).limit)
        assert s.allocated >= 0 and s.fair_share >= 0 and s.demand >= 0
    want = {(q.name, p) for q in before.queues for p in pools_of(before)}
    assert seen == want, f"shares cover {sorted(seen ^ want)} wrongly"
