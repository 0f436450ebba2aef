"""Pending reasons with their numbers, and the final pass that gives every waiting workload one.

Each reason is a code, structured arguments (integer units and names; `Pending.args` lists them per code) and a
default sentence. The arguments are worked out once per class of workload (`Session.classes`) and shared by its
members, so the final pass stays a lookup per pending workload."""

from __future__ import annotations

import bisect
from collections.abc import Callable

import numpy as np

from gpupool.core.decision import Arg, Pending, PendingCode
from gpupool.core.model import MILLI, Request, State
from gpupool.core.placement.index import IntArray
from gpupool.core.placement.placer import group_key
from gpupool.core.quota import gpu_count, gpus
from gpupool.core.session import Session
from gpupool.core.state import NodeState, WorkingState, WorkloadState

REQUEST_FIELDS = ("gpus", "gpu_milli", "gpu_memory_mib", "cpu_milli", "memory_mib")
CAPACITY = (PendingCode.NO_NODE_FITS, PendingCode.GANG_UNPLACEABLE)
QUOTA = (PendingCode.OVER_LIMIT, PendingCode.NONPREEMPTIBLE_OVER_DESERVED)
BEHIND = (*CAPACITY, PendingCode.OVER_DESERVED)
"""Reasons a workload's place in its project's queue adds to: higher-priority work of its project goes first."""

Blocker = tuple[PendingCode, tuple[Arg, ...]]


def describe(req: Request) -> str:
    if req.gpus:
        gpu = f"{req.gpus} free GPU{'s' if req.gpus > 1 else ''}"
    elif req.gpu_milli:
        gpu = f"a device with {gpus(req.gpu_milli)} of a GPU free"
    elif req.gpu_memory_mib:
        gpu = f"a device with {req.gpu_memory_mib} MiB of GPU memory free"
    else:
        gpu = "room"
    host = []
    if req.cpu_milli:
        host.append(f"{gpus(req.cpu_milli)} CPUs")
    if req.memory_mib:
        host.append(f"{req.memory_mib} MiB of memory")
    return gpu + (f" and {' and '.join(host)}" if host else "")


def where(ws: WorkloadState) -> str:
    w = ws.w
    pools = f"pool{'s' if len(w.pools) > 1 else ''} {', '.join(w.pools)}" if w.pools else "any pool"
    if w.clusters:
        pools += f" in cluster{'s' if len(w.clusters) > 1 else ''} {', '.join(w.clusters)}"
    models = f" with GPU model {' or '.join(w.gpu_models)}" if w.gpu_models else ""
    return pools + models


def request_args(ws: WorkloadState) -> tuple[Arg, ...]:
    req = ws.w.request
    return (("members", ws.w.gang_size), *((f, getattr(req, f)) for f in REQUEST_FIELDS if getattr(req, f)))


def never_fits(ws: WorkloadState) -> Pending:
    w = ws.w
    what = f"{w.gang_size} members with {describe(w.request)} each" if w.gang_size > 1 else describe(w.request)
    return Pending(
        w.id, PendingCode.NEVER_FITS, f"no node in {where(ws)} could host {what}, even empty", (), request_args(ws)
    )


def no_room(ws: WorkloadState) -> Pending:
    w = ws.w
    if w.gang_size > 1:
        return Pending(
            w.id,
            PendingCode.GANG_UNPLACEABLE,
            f"gang of {w.gang_size} members, each needing {describe(w.request)}, cannot be placed whole in {where(ws)}",
            (),
            request_args(ws),
        )
    return Pending(
        w.id, PendingCode.NO_NODE_FITS, f"no node in {where(ws)} has {describe(w.request)}", (), request_args(ws)
    )


def unshared(ws: WorkloadState, pool: str) -> Pending:
    """It would fit, in `pool`, only beside other projects' shares, which the pool does not allow."""
    w, req = ws.w, ws.w.request
    free = f"{gpus(req.gpu_milli)} of a GPU" if req.gpu_milli else f"{req.gpu_memory_mib} MiB of GPU memory"
    each = f" for each of its {w.gang_size} members" if w.gang_size > 1 else ""
    return Pending(
        w.id,
        PendingCode.NO_SHAREABLE_DEVICE,
        f"the only devices in {where(ws)} with {free} free{each} are shared with other projects; "
        f"pool {pool} does not allow sharing a device across projects",
        (),
        (*request_args(ws), ("pool", pool)),
    )


def waiting(ws: WorkloadState, victims: int | None = None) -> Pending:
    what = f"{victims} evicted workload{'s' if victims != 1 else ''}" if victims else "evicted workloads"
    return Pending(
        ws.w.id,
        PendingCode.WAITING_FOR_EVICTIONS,
        f"waiting for {what} to release their GPUs; it will start on {_nodes(ws)}",
        nominated=ws.placements,
    )


def min_runtime(ws: WorkloadState, victim: WorkloadState, until: float) -> Pending:
    """It would start by evicting `victim`, which its minimum runtime protects until `until`. Another project's
    victim goes unnamed (`Workload.named_for`)."""
    v = victim.w
    name: tuple[Arg, ...] = (("victim", v.shown),) if v.project == ws.w.project else ()
    who = v.shown if name else "a workload"
    return Pending(
        ws.w.id,
        PendingCode.MIN_RUNTIME,
        f"waiting for {who} of project {v.project} to pass its minimum runtime "
        f"(until {int(until)} s since the epoch) before it may be evicted",
        (),
        (("until", int(until)), *name, ("project", v.project), ("gpu_milli", victim.milli)),
    )


class Quotas:
    """The quotas above each project, per pool, as the rooms left under them: worked out once per queue and pool,
    so that a class's blocker is a few comparisons."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._rooms: dict[tuple[int, int], list[tuple[PendingCode, str, int, tuple[Arg, ...]]]] = {}
        self._borrow: dict[tuple[int, int], tuple[int, tuple[Arg, ...]]] = {}
        self._borrowed: dict[tuple[int, int], Pending] = {}
        self._capacity: list[int] | None = None

    def blocker(self, ws: WorkloadState, pool_idx: int, borrowing: bool) -> Blocker | None:
        """The first quota of its project and the departments above it that the whole workload would pass in
        this pool: a limit, a deserved quota it must fit (not preemptible) or, where `borrowing`, the deserved
        quota (and fair share) beyond which preemptible work only borrows idle GPUs. None where it passes none."""
        w = ws.w
        req, n = w.request, w.gang_size
        asks = {"gpu": req.nominal_milli() * n, "cpu": req.cpu_milli * n, "memory": req.memory_mib * n}
        for code, resource, room, args in self._rooms_of(ws.queue, pool_idx):
            if code is PendingCode.NONPREEMPTIBLE_OVER_DESERVED and w.preemptible:
                continue
            if code is PendingCode.OVER_DESERVED and not (borrowing and w.preemptible):
                continue
            ask = asks[resource]
            if ask and ask > room:
                return code, (*args, ("asks", ask))
        return None

    def borrowing(self, ws: WorkloadState, pools: list[int]) -> Pending | None:
        """Over-deserved, where in every pool of `pools` the workload's GPUs would take its project or a
        department above it past both its deserved quota and its fair share (first pool first); shared by every
        workload asking as much there. Limits and CPU or memory quotas are allocate's to name (quota.check)."""
        if not ws.w.preemptible or not pools:
            return None
        ask = ws.w.request.nominal_milli() * ws.w.gang_size
        over = [self._borrow_room(ws.queue, p) for p in pools]
        if not ask or any(ask <= room for room, _ in over):
            return None
        if any(ask > self._beside(ws.queue, p) for p in pools):
            # Even with every other project's work gone it would not fit: the pool is what it lacks (its project
            # alone fills it), not a quota; the capacity reason says so.
            return None
        key = (id(over[0][1]), ask)  # `_borrow` holds the arguments: their id stays theirs
        found = self._borrowed.get(key)
        if found is None:
            args = (*over[0][1], ("asks", ask))
            found = self._borrowed[key] = Pending(ws.w.id, PendingCode.OVER_DESERVED, _over_deserved(args), (), args)
        return found

    def _beside(self, queue: int, pool_idx: int) -> int:
        """The pool's GPUs (milli) that its project does not hold: what it could have if no other project ran."""
        if self._capacity is None:
            state = self.session.state
            self._capacity = [0] * len(state.pools)
            for n in state.nodes:
                if n.schedulable:
                    self._capacity[n.pool_idx] += len(n.devices) * MILLI
        return self._capacity[pool_idx] - self.session.state.used[queue][pool_idx]

    def _borrow_room(self, queue: int, pool_idx: int) -> tuple[int, tuple[Arg, ...]]:
        """The GPU room (milli) its chain leaves before one of them passes deserved and fair share, and the
        arguments naming that one."""
        found = self._borrow.get((queue, pool_idx))
        if found is None:
            found = min(
                ((room, args) for code, resource, room, args in self._rooms_of(queue, pool_idx)
                 if code is PendingCode.OVER_DESERVED and resource == "gpu"),
                key=lambda x: x[0],
                default=(1 << 62, ()),
            )  # fmt: skip
            self._borrow[(queue, pool_idx)] = found
        return found

    def _rooms_of(self, queue: int, pool_idx: int) -> list[tuple[PendingCode, str, int, tuple[Arg, ...]]]:
        """In the order quota.check looks: per queue up the chain, per resource, the limit, then the deserved quota
        for non-preemptible work, then the deserved quota (or fair share) beyond which work borrows."""
        found = self._rooms.get((queue, pool_idx))
        if found is not None:
            return found
        state, tree = self.session.state, self.session.state.tree
        pool = state.pools[pool_idx]
        found = []
        for q in tree.chain[queue]:
            quota = tree.queues[q].quota(pool)
            head: tuple[Arg, ...] = (
                ("queue", tree.queues[q].name),
                ("level", "department" if tree.children[q] else "project"),
                ("pool", pool),
            )
            host = state.host_used[q][pool_idx]
            fair = self.session.fair[q][pool_idx]
            for resource, used, np_used, limit, deserved, share in (
                ("gpu", state.used[q][pool_idx], state.np_used[q][pool_idx], quota.limit, quota.deserved, fair),
                ("cpu", host[0], host[2], quota.cpu_limit, quota.cpu_deserved, quota.cpu_deserved),
                ("memory", host[1], host[3], quota.memory_limit, quota.memory_deserved, quota.memory_deserved),
            ):
                kind = (*head, ("resource", resource))
                if limit is not None:
                    numbers = (*kind, ("used", used), ("quota", limit))
                    found.append((PendingCode.OVER_LIMIT, resource, limit - used, numbers))
                if deserved is None or share is None:
                    continue
                found.append((
                    PendingCode.NONPREEMPTIBLE_OVER_DESERVED, resource, deserved - np_used,
                    (*kind, ("used", np_used), ("quota", deserved)),
                ))  # fmt: skip
                extra: tuple[Arg, ...] = (("fair", share),) if resource == "gpu" else ()
                found.append((
                    PendingCode.OVER_DESERVED, resource, max(deserved, share) - used,
                    (*kind, ("used", used), ("quota", deserved), *extra),
                ))  # fmt: skip
        self._rooms[(queue, pool_idx)] = found
        return found


def explain_all(session: Session) -> tuple[Pending, ...]:
    """A reason for every workload still pending, in workload order.

    An action's reason may be its class's, shared by the workloads allocate did not try again and naming the
    one it did (`allocate._allocate_settling`). Each distinct reason is enriched once per place in its project's
    queue, and each workload gets its own copy of the result: a pending workload costs one lookup and one
    Pending."""
    out: list[Pending] = list(session.unknown)
    priorities: dict[int, list[int]] = {}
    for ws in session.state.workloads:
        if ws.state is State.PENDING or (ws.bound and ws.pipelined):
            priorities.setdefault(ws.queue, []).append(ws.w.priority)
    for values in priorities.values():
        values.sort()
    enrich = _Enricher(session)
    done: dict[tuple[int, int, int], tuple[Pending, PendingCode, str, tuple[Arg, ...]]] = {}
    """(id of an action's reason, higher-priority workloads of its project, its queue) -> that reason (held, so
    the id stays its own) and the code, sentence and arguments its workloads get."""
    for ws in session.state.workloads:
        if ws.bound and ws.pipelined:
            reason = session.pending.get(ws.idx) or waiting(ws)
            out.append(reason if reason.args else enrich.evictions(ws, reason))
            continue
        if ws.state is not State.PENDING:
            continue
        given = session.pending.get(ws.idx) or no_room(ws)
        values = priorities[ws.queue]
        key = (id(given), len(values) - bisect.bisect_right(values, ws.w.priority), ws.queue)
        found = done.get(key)
        if found is None or found[0] is not given:
            found = done[key] = (given, *_behind(ws, enrich(ws, given), key[1]))
        out.append(Pending(ws.w.id, found[1], found[2], (), found[3]))
    out.sort(key=lambda p: p.workload)
    return tuple(out)


def _behind(ws: WorkloadState, reason: Pending, higher: int) -> tuple[PendingCode, str, tuple[Arg, ...]]:
    """The reason a workload with `higher` higher-priority workloads ahead of it in its project gets."""
    if not higher or reason.code not in BEHIND:
        return reason.code, reason.message, reason.args
    return (
        PendingCode.QUEUED_BEHIND,
        f"queued behind {higher} higher-priority workload{'s' if higher > 1 else ''} of project {ws.w.project}; "
        f"{reason.message}",
        (("ahead", higher), ("project", ws.w.project), ("blocker", reason.code.value), *reason.args),
    )


class _Enricher:
    """Arguments for reasons given without them, and the quota behind a capacity reason, once per class: the
    template it returns may name another workload of the class (the caller renames it)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.classes = session.classes()
        self.quotas = Quotas(session)
        self.found: dict[tuple[int, str], Pending] = {}
        self.pools: dict[tuple[object, ...], list[int]] = {}
        self.near: dict[tuple[object, ...], tuple[Arg, ...]] = {}
        self._free: _Free | None = None
        self._by_id: dict[str, WorkloadState] | None = None
        self._releasing: dict[str, list[WorkloadState]] | None = None
        """Node name -> the workloads releasing devices there."""

    def __call__(self, ws: WorkloadState, reason: Pending) -> Pending:
        if reason.code not in CAPACITY and (reason.args or reason.code not in (*QUOTA, PendingCode.NEVER_FITS)):
            return reason
        key = (self.classes[ws.idx], reason.message)  # the message names the code
        found = self.found.get(key)
        if found is None:
            found = self.found[key] = self._better(ws, reason)
        return found

    def _better(self, ws: WorkloadState, reason: Pending) -> Pending:
        if reason.code in CAPACITY:
            over = self.quotas.borrowing(ws, self._pools(ws))
            if over is not None:
                return over
            near = self._closest(ws)
            if not near and reason.args:
                return reason
            return Pending(ws.w.id, reason.code, reason.message, (), (reason.args or request_args(ws)) + near)
        if reason.code is PendingCode.NEVER_FITS:
            return Pending(ws.w.id, reason.code, reason.message, (), request_args(ws))
        blocker = self._quota(ws, borrowing=False, only=reason.code)
        return reason if blocker is None else Pending(ws.w.id, reason.code, reason.message, (), blocker[1])

    def _quota(self, ws: WorkloadState, borrowing: bool, only: PendingCode) -> Blocker | None:
        """The blocker of code `only` in its most preferred pool, where every candidate pool has that blocker."""
        found = [self.quotas.blocker(ws, p, borrowing) for p in self._pools(ws)]
        if not found or any(f is None or f[0] is not only for f in found):
            return None
        return found[0]

    def _pools(self, ws: WorkloadState) -> list[int]:
        """Its candidate pools, most preferred first (as allocate names the first pool's quota)."""
        key = group_key(ws)
        found = self.pools.get(key)
        if found is None:
            found = self.pools[key] = sorted(
                self.session.placer.candidate_pools(ws), key=_preference(ws, self.session.state)
            )
        return found

    def _closest(self, ws: WorkloadState) -> tuple[Arg, ...]:
        """The node that comes closest to hosting one member now, and what it lacks; for a gang also how many
        members its best pool could host now. Once per shape of request."""
        w = ws.w
        shape = (w.request, w.pools, w.clusters, w.gpu_models, w.gang_size)
        found = self.near.get(shape)
        if found is None:
            if self._free is None:
                self._free = _Free(self.session.state.nodes)
            groups = [rows for group in self.session.placer.pools_of(ws) for _, rows in group]
            found = self.near[shape] = self._free.closest(groups, w.request, w.gang_size)
        return found

    def evictions(self, ws: WorkloadState, reason: Pending) -> Pending:
        """What a workload placed behind evictions waits for: this cycle's evictions for it, else the releasing
        work on its nodes."""
        state = self.session.state
        if self._by_id is None or self._releasing is None:
            self._by_id, self._releasing = {}, {}
            evicted = {e.workload for e in state.evictions}
            for v in state.workloads:
                if v.w.id in evicted:
                    self._by_id[v.w.id] = v
                if v.state is State.RELEASING:
                    for node in {p.node for p in v.placements}:
                        self._releasing.setdefault(node, []).append(v)
        victims = [self._by_id[e.workload] for e in state.evictions if e.preemptor == ws.w.id]
        if not victims:
            on = {v.idx: v for p in ws.placements for v in self._releasing.get(p.node, ())}
            victims = [on[i] for i in sorted(on)]
        borrowers = sorted({v.w.project for v in victims} - {ws.w.project})
        args: tuple[Arg, ...] = (
            ("victims", len(victims)),
            ("gpu_milli", sum(v.milli or v.w.request.nominal_milli() * v.w.gang_size for v in victims)),
            ("borrowers", ",".join(borrowers)),
            ("nodes", ",".join(sorted({p.node for p in ws.placements}))),
        )
        return Pending(ws.w.id, reason.code, reason.message, reason.nominated, args)


def _over_deserved(args: tuple[Arg, ...]) -> str:
    a = dict(args)
    return (
        f"{a['level']} {a['queue']} uses {gpus(int(a['used']))} of its deserved {gpu_count(int(a['quota']))} in "
        f"pool {a['pool']}; asking {gpus(int(a['asks']))} more, it may only borrow idle GPUs, and none are idle"
    )


LACKS = ("lacks_gpus", "lacks_gpu_milli", "lacks_gpu_memory_mib", "lacks_cpu_milli", "lacks_memory_mib")


class _Free:
    """What each node has free now (releasing work still holds its part), as arrays by node index."""

    def __init__(self, nodes: list[NodeState]) -> None:
        self.names = [n.name for n in nodes]
        self.schedulable = np.array([n.schedulable for n in nodes], dtype=bool)
        self.whole = np.array([n.free_whole(False) for n in nodes], dtype=np.int64)
        self.share = np.array([n.summary()[2] for n in nodes], dtype=np.int64)
        self.device_memory = np.array(
            [max((d.memory - d.used_mem - d.rel_mem for d in n.devices if not d.whole and not d.rel_whole), default=0)
             for n in nodes],
            dtype=np.int64,
        )  # fmt: skip
        self.cpu = np.array([n.cpu - n.used_cpu - n.rel_cpu for n in nodes], dtype=np.int64)
        self.memory = np.array([n.memory - n.used_memory - n.rel_memory for n in nodes], dtype=np.int64)

    def closest(self, groups: list[IntArray], req: Request, members: int) -> tuple[Arg, ...]:
        best: tuple[tuple[int, ...], str] | None = None
        fits = 0
        for rows in groups:
            rows = rows[self.schedulable[rows]]
            if not len(rows):
                continue
            lacks = np.stack([
                np.maximum(0, need - free[rows]) if need else np.zeros(len(rows), np.int64)
                for need, free in (
                    (req.gpus, self.whole), (req.gpu_milli, self.share), (req.gpu_memory_mib, self.device_memory),
                    (req.cpu_milli, self.cpu), (req.memory_mib, self.memory),
                )
            ])  # fmt: skip
            count = (lacks > 0).sum(axis=0)
            i = int(np.lexsort((*lacks[::-1], count))[0])  # fewest lacks, then least GPU lacking, ...
            key = (int(count[i]), *(int(x) for x in lacks[:, i]))
            if best is None or (key, self.names[int(rows[i])]) < best:
                best = (key, self.names[int(rows[i])])
            room = np.full(len(rows), 1, np.int64) if not req.gpus else self.whole[rows] // req.gpus
            if req.cpu_milli:
                room = np.minimum(room, self.cpu[rows] // req.cpu_milli)
            if req.memory_mib:
                room = np.minimum(room, self.memory[rows] // req.memory_mib)
            fits = max(fits, int(np.where(count == 0, np.maximum(room, 0), 0).sum()))
        if best is None or not best[0][0]:
            return ()
        lacking = tuple((name, v) for name, v in zip(LACKS, best[0][1:], strict=True) if v)
        return (("node", best[1]), *lacking, *((("fits", fits),) if members > 1 else ()))


def _preference(ws: WorkloadState, state: WorkingState) -> Callable[[int], tuple[int, str]]:
    pools = ws.w.pools

    def key(p: int) -> tuple[int, str]:
        name = state.pools[p]
        return (pools.index(name) if name in pools else len(pools), name)

    return key


def _nodes(ws: WorkloadState) -> str:
    return ", ".join(sorted({p.node for p in ws.placements}))
