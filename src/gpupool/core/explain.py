"""Pending reasons with their numbers, and the final pass that gives every waiting workload one.

Each reason is a code, structured arguments (integer units and names; `Pending.args` lists them per code) and a
default sentence. The arguments are worked out once per class of workload (`Session.classes`) and shared by its
members, so the final pass stays a lookup per pending workload."""

from __future__ import annotations

import bisect
from collections.abc import Callable

from gpupool.core.decision import Arg, Pending, PendingCode
from gpupool.core.model import Request, State
from gpupool.core.quota import gpus
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
    """It would start by evicting `victim`, which its minimum runtime protects until `until`."""
    return Pending(
        ws.w.id,
        PendingCode.MIN_RUNTIME,
        f"waiting for {victim.w.shown} of project {victim.w.project} to pass its minimum runtime "
        f"(until {int(until)} s since the epoch) before it may be evicted",
        (),
        (("until", int(until)), ("victim", victim.w.shown), ("project", victim.w.project), ("gpu_milli", victim.milli)),
    )


def quota_blocker(session: Session, ws: WorkloadState, pool_idx: int, borrowing: bool) -> Blocker | None:
    """The first quota of its project and the departments above it that the whole workload would pass in this pool:
    a limit, a deserved quota it must fit (not preemptible) or, where `borrowing`, the deserved quota (and fair share)
    beyond which preemptible work only borrows idle GPUs. None where it passes none."""
    state, w = session.state, ws.w
    req, n = w.request, w.gang_size
    pool = state.pools[pool_idx]
    tree = state.tree
    for q in tree.chain[ws.queue]:
        quota = tree.queues[q].quota(pool)
        head: tuple[Arg, ...] = (
            ("queue", tree.queues[q].name),
            ("level", "department" if tree.children[q] else "project"),
            ("pool", pool),
        )
        host = state.host_used[q][pool_idx]
        for resource, asks, used, np_used, limit, deserved in (
            ("gpu", req.nominal_milli() * n, state.used[q][pool_idx], state.np_used[q][pool_idx], quota.limit,
             quota.deserved),
            ("cpu", req.cpu_milli * n, host[0], host[2], quota.cpu_limit, quota.cpu_deserved),
            ("memory", req.memory_mib * n, host[1], host[3], quota.memory_limit, quota.memory_deserved),
        ):  # fmt: skip
            numbers = (("resource", resource), ("asks", asks))
            if not asks:
                continue
            if limit is not None and used + asks > limit:
                return PendingCode.OVER_LIMIT, (*head, *numbers, ("used", used), ("quota", limit))
            if deserved is None:
                continue
            if not w.preemptible and np_used + asks > deserved:
                return PendingCode.NONPREEMPTIBLE_OVER_DESERVED, (
                    *head,
                    *numbers,
                    ("used", np_used),
                    ("quota", deserved),
                )
            fair = session.fair[q][pool_idx] if resource == "gpu" else deserved
            if borrowing and w.preemptible and used + asks > max(deserved, fair):
                extra = (("fair", fair),) if resource == "gpu" else ()
                return PendingCode.OVER_DESERVED, (*head, *numbers, ("used", used), ("quota", deserved), *extra)
    return None


def explain_all(session: Session) -> tuple[Pending, ...]:
    """A reason for every workload still pending, in workload order."""
    out: list[Pending] = list(session.unknown)
    priorities: dict[int, list[int]] = {}
    for ws in session.state.workloads:
        if ws.state is State.PENDING or (ws.bound and ws.pipelined):
            priorities.setdefault(ws.queue, []).append(ws.w.priority)
    for values in priorities.values():
        values.sort()
    enrich = _Enricher(session)
    for ws in session.state.workloads:
        if ws.bound and ws.pipelined:
            reason = session.pending.get(ws.idx) or waiting(ws)
            out.append(reason if reason.args else enrich.evictions(ws, reason))
            continue
        if ws.state is not State.PENDING:
            continue
        reason = enrich(ws, session.pending.get(ws.idx) or no_room(ws))
        if reason.code in BEHIND:
            values = priorities[ws.queue]
            higher = len(values) - bisect.bisect_right(values, ws.w.priority)
            if higher:
                reason = Pending(
                    ws.w.id,
                    PendingCode.QUEUED_BEHIND,
                    f"queued behind {higher} higher-priority workload{'s' if higher > 1 else ''} "
                    f"of project {ws.w.project}; {reason.message}",
                    (),
                    (("ahead", higher), ("project", ws.w.project), ("blocker", reason.code.value), *reason.args),
                )
        out.append(reason)
    out.sort(key=lambda p: p.workload)
    return tuple(out)


class _Enricher:
    """Arguments for reasons given without them, and the quota behind a capacity reason, once per class."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.classes = session.classes()
        self.found: dict[tuple[int, PendingCode, str], Pending | None] = {}
        self._by_id: dict[str, WorkloadState] | None = None

    def __call__(self, ws: WorkloadState, reason: Pending) -> Pending:
        if reason.code not in CAPACITY and (reason.args or reason.code not in (*QUOTA, PendingCode.NEVER_FITS)):
            return reason
        key = (self.classes[ws.idx], reason.code, reason.message)
        if key not in self.found:
            self.found[key] = self._better(ws, reason)
        better = self.found[key]
        if better is None:
            return reason
        return better if better.workload == ws.w.id else better.to(ws.w.id)

    def _better(self, ws: WorkloadState, reason: Pending) -> Pending | None:
        if reason.code in CAPACITY:
            args = reason.args or request_args(ws)
            blocker = self._quota(ws, borrowing=True, only=PendingCode.OVER_DESERVED)
            if blocker is not None:
                return Pending(ws.w.id, PendingCode.OVER_DESERVED, _over_deserved(ws, blocker[1]), (), blocker[1])
            near = _closest(self.session, ws)
            return None if not near and reason.args else Pending(ws.w.id, reason.code, reason.message, (), args + near)
        if reason.code is PendingCode.NEVER_FITS:
            return Pending(ws.w.id, reason.code, reason.message, (), request_args(ws))
        blocker = self._quota(ws, borrowing=False, only=reason.code)
        return None if blocker is None else Pending(ws.w.id, reason.code, reason.message, (), blocker[1])

    def _quota(
        self, ws: WorkloadState, borrowing: bool, only: PendingCode
    ) -> tuple[PendingCode, tuple[Arg, ...]] | None:
        """The blocker of code `only` in its most preferred pool, where every candidate pool has that blocker."""
        pools = sorted(self.session.placer.candidate_pools(ws), key=_preference(ws, self.session.state))
        found = [quota_blocker(self.session, ws, p, borrowing) for p in pools]
        if not found or any(f is None or f[0] is not only for f in found):
            return None
        return found[0]

    def evictions(self, ws: WorkloadState, reason: Pending) -> Pending:
        """What a workload placed behind evictions waits for: this cycle's evictions for it, else the releasing
        work on its nodes."""
        state = self.session.state
        if self._by_id is None:
            self._by_id = {v.w.id: v for v in state.workloads}
        victims = [self._by_id[e.workload] for e in state.evictions if e.preemptor == ws.w.id]
        if not victims:
            nodes = {p.node for p in ws.placements}
            victims = [
                v for v in state.workloads if v.state is State.RELEASING and any(p.node in nodes for p in v.placements)
            ]
        borrowers = sorted({v.w.project for v in victims} - {ws.w.project})
        args: tuple[Arg, ...] = (
            ("victims", len(victims)),
            ("gpu_milli", sum(v.milli or v.w.request.nominal_milli() * v.w.gang_size for v in victims)),
            ("borrowers", ",".join(borrowers)),
            ("nodes", ",".join(sorted({p.node for p in ws.placements}))),
        )
        return Pending(ws.w.id, reason.code, reason.message, reason.nominated, args)


def _over_deserved(ws: WorkloadState, args: tuple[Arg, ...]) -> str:
    a = dict(args)
    unit = {"gpu": " GPUs", "cpu": " millicores", "memory": " MiB"}[str(a["resource"])]
    amount = (lambda v: gpus(int(v))) if a["resource"] == "gpu" else str
    return (
        f"{a['level']} {a['queue']} uses {amount(a['used'])} of its deserved {amount(a['quota'])}{unit} in pool "
        f"{a['pool']}; {ws.w.shown} asks {amount(a['asks'])} more, which only idle GPUs may lend, and none are idle"
    )


def _closest(session: Session, ws: WorkloadState) -> tuple[Arg, ...]:
    """The node that comes closest to hosting one member now, and what it lacks; for a gang also how many
    members its best pool could host now."""
    req = ws.w.request
    best: tuple[tuple[int, ...], str] | None = None
    fits = 0
    for group in session.placer.groups(ws):
        room = 0
        for n in group:
            if not n.schedulable:
                continue
            lacks = _lacks(n, req)
            key = (sum(1 for x in lacks if x), *lacks)
            if best is None or (key, n.name) < best:
                best = (key, n.name)
            room += _members(n, req) if not any(lacks) else 0
        fits = max(fits, room)
    if best is None or not best[0][0]:
        return ()
    names = ("lacks_gpus", "lacks_gpu_milli", "lacks_gpu_memory_mib", "lacks_cpu_milli", "lacks_memory_mib")
    lacking = tuple((name, v) for name, v in zip(names, best[0][1:], strict=True) if v)
    return (("node", best[1]), *lacking, *((("fits", fits),) if ws.w.gang_size > 1 else ()))


def _lacks(n: NodeState, req: Request) -> tuple[int, int, int, int, int]:
    """What node `n` lacks now for one member: whole GPUs, a device's share, a device's memory, CPU, memory."""
    whole = max(0, req.gpus - n.free_whole(False)) if req.gpus else 0
    share = max(0, req.gpu_milli - n.summary()[2]) if req.gpu_milli else 0
    device_memory = 0
    if req.gpu_memory_mib:
        free = [d.memory - d.used_mem - d.rel_mem for d in n.devices if not d.whole and not d.rel_whole]
        device_memory = max(0, req.gpu_memory_mib - max(free, default=0))
    cpu = max(0, n.used_cpu + n.rel_cpu + req.cpu_milli - n.cpu)
    memory = max(0, n.used_memory + n.rel_memory + req.memory_mib - n.memory)
    return whole, share, device_memory, cpu, memory


def _members(n: NodeState, req: Request) -> int:
    """Members of `req` node `n` could host now (an estimate: host resources and whole GPUs bound it)."""
    bounds = [n.free_whole(False) // req.gpus] if req.gpus else [1]
    if req.cpu_milli:
        bounds.append((n.cpu - n.used_cpu - n.rel_cpu) // req.cpu_milli)
    if req.memory_mib:
        bounds.append((n.memory - n.used_memory - n.rel_memory) // req.memory_mib)
    return max(0, min(bounds))


def _preference(ws: WorkloadState, state: WorkingState) -> Callable[[int], tuple[int, str]]:
    pools = ws.w.pools

    def key(p: int) -> tuple[int, str]:
        name = state.pools[p]
        return (pools.index(name) if name in pools else len(pools), name)

    return key


def _nodes(ws: WorkloadState) -> str:
    return ", ".join(sorted({p.node for p in ws.placements}))
