"""The mutable working state of one cycle, with a journal so any try can be rolled back.

Capacity held by a workload is counted in two layers: `used` (running, newly bound or pipelined) and
`rel` (releasing: evicted, its processes still exiting). A normal placement needs room in both layers; a
pipelined placement (one that starts once evictions finish) needs room in `used` only. Quota usage counts
only `used`, so a project whose workloads are being evicted is not charged for them twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gpupool.core.decision import Eviction
from gpupool.core.model import MILLI, Node, Placement, Queue, Request, State, Workload

ANY_PROJECT = -1
"""In place of a project: a placement that ignores who else holds shares of a device (to explain a wait)."""
NO_SHARER = -2
"""`NodeState.sole`: no project holds shares on the node."""
SEVERAL = -3
"""`NodeState.sole`: more than one project holds shares on the node."""


class DeviceState:
    __slots__ = (
        "exclusive",
        "holders",
        "index",
        "memory",
        "model",
        "rel",
        "rel_holders",
        "rel_mem",
        "rel_whole",
        "used",
        "used_mem",
        "whole",
    )

    def __init__(self, index: int, model: str, memory: int, exclusive: bool = False) -> None:
        self.index = index
        self.model = model
        self.memory = memory
        self.used = 0
        self.used_mem = 0
        self.whole = False
        self.rel = 0
        self.rel_mem = 0
        self.rel_whole = False
        self.exclusive = exclusive
        """Its pool does not allow sharing across projects: its shares must all be of one project."""
        self.holders: dict[int, int] = {}
        """Project (queue index) -> shares it holds here in `used`; kept only where `exclusive`."""
        self.rel_holders: dict[int, int] = {}
        """The same for the shares in `rel` (releasing)."""

    def whole_free(self, pipelined: bool) -> bool:
        return self.used == 0 and (pipelined or self.rel == 0)

    def fits_share(self, milli: int, mem: int, pipelined: bool) -> bool:
        if self.whole:
            return False
        if pipelined:
            return self.used + milli <= MILLI and self.used_mem + mem <= self.memory
        if self.rel_whole:
            return False
        return self.used + self.rel + milli <= MILLI and self.used_mem + self.rel_mem + mem <= self.memory

    def admits(self, project: int, pipelined: bool) -> bool:
        """Whether a share of `project` may join the shares here: always where the pool allows sharing across
        projects, else only if every holder is of that project. A pipelined share starts once releasing work
        is gone, so only the holders that stay count for it."""
        if not self.exclusive or project == ANY_PROJECT:
            return True
        if any(q != project for q in self.holders):
            return False
        return pipelined or all(q == project for q in self.rel_holders)

    def free_milli(self) -> int:
        if self.whole or self.rel_whole:
            return 0
        return MILLI - self.used - self.rel


class NodeState:
    __slots__ = (
        "_by_index",
        "_ranked",
        "_ranked_version",
        "_summary",
        "_summary_version",
        "cluster",
        "cpu",
        "devices",
        "exclusive",
        "idx",
        "memory",
        "models",
        "name",
        "pool",
        "pool_idx",
        "rel_cpu",
        "rel_memory",
        "rel_sharers",
        "residents",
        "schedulable",
        "sharers",
        "signature",
        "used_cpu",
        "used_memory",
        "version",
    )

    def __init__(self, node: Node, idx: int, pool_idx: int, exclusive: bool = False) -> None:
        self.name = node.name
        self.idx = idx
        self.pool = node.pool
        self.pool_idx = pool_idx
        self.cluster = node.cluster
        self.cpu = node.cpu_milli
        self.memory = node.memory_mib
        ordered = sorted(node.devices, key=lambda d: d.index)
        self.devices = [DeviceState(d.index, d.model, d.memory_mib, exclusive) for d in ordered]
        self.exclusive = exclusive
        """Its pool does not allow sharing a device across projects (`DeviceState.admits`)."""
        self.sharers: dict[int, int] = {}
        """Where `exclusive`: project -> shares it holds on the node's devices (`used`)."""
        self.rel_sharers: dict[int, int] = {}
        """The same for releasing shares (`rel`)."""
        self._by_index = {d.index: d for d in self.devices}
        self.models = frozenset(d.model for d in node.devices)
        self.schedulable = node.schedulable
        self.used_cpu = 0
        self.used_memory = 0
        self.rel_cpu = 0
        self.rel_memory = 0
        self.version = 0
        """Bumped on every change, so scorers may cache per node state."""
        self.signature = -1
        """Equal for nodes in identical states (kept by the placement index); -1 until indexed."""
        self.residents: dict[int, int] = {}
        """Workload index -> members of it placed here (running or pipelined, not releasing)."""
        self._summary: tuple[int, int, int, int] = (0, 0, 0, 0)
        self._summary_version = -1
        self._ranked: list[int] = []
        self._ranked_version = -1

    def device(self, index: int) -> DeviceState:
        return self._by_index[index]

    def summary(self) -> tuple[int, int, int, int]:
        """(whole GPUs free now, whole GPUs free once releasing work is gone, largest share free now, and then).

        Cached per version: placement scans use it to skip nodes that cannot host a request at all.
        """
        if self._summary_version != self.version:
            whole_now = whole_later = share_now = share_later = 0
            for d in self.devices:
                if d.used == 0:
                    whole_later += 1
                    if d.rel == 0:
                        whole_now += 1
                if not d.whole:
                    later = MILLI - d.used
                    share_later = max(share_later, later)
                    if not d.rel_whole:
                        share_now = max(share_now, later - d.rel)
            self._summary = (whole_now, whole_later, share_now, share_later)
            self._summary_version = self.version
        return self._summary

    def admission(self, req: Request, project: int, pipelined: bool) -> tuple[bool, ...] | None:
        """Which devices admit a share of `project` (`DeviceState.admits`), as a key that, with the node's
        state, decides a placement (scorers key their caches on it): None when all do (no other project
        holds shares here, or `req` asks for no share); () when those free of shares do (one other project
        holds shares here, and `project` none: which devices that is follows from the node's state); else
        which devices do."""
        if not self.exclusive or project == ANY_PROJECT or not (req.gpu_milli or req.gpu_memory_mib):
            return None
        sole = self.sole(pipelined)
        if sole in (NO_SHARER, project):
            return None
        if not self.holds(project, pipelined):
            return ()
        mask = tuple(d.admits(project, pipelined) for d in self.devices)
        return None if all(mask) else mask

    def sole(self, pipelined: bool) -> int:
        """The one project holding shares on the node (releasing ones count unless `pipelined`): NO_SHARER
        when none does, SEVERAL when more do. Kept only where `exclusive`."""
        projects = self.sharers.keys() if pipelined else self.sharers.keys() | self.rel_sharers.keys()
        if not projects:
            return NO_SHARER
        if len(projects) > 1:
            return SEVERAL
        return next(iter(projects))

    def holds(self, project: int, pipelined: bool) -> bool:
        """Whether `project` holds shares on the node (releasing ones count unless `pipelined`)."""
        return project in self.sharers or (not pipelined and project in self.rel_sharers)

    def shared_devices(self) -> int:
        """Devices holding fractional work only (they could be freed whole by evicting their sharers)."""
        return sum(1 for d in self.devices if not d.whole and d.used > 0)

    def ranked_residents(self, key: Callable[[int], tuple[int, float, str]]) -> list[int]:
        """Resident workload indices in `key` order, cached per version (victim search asks often)."""
        if self._ranked_version != self.version:
            self._ranked = sorted(self.residents, key=key)
            self._ranked_version = self.version
        return self._ranked

    def fits_host(self, req: Request, pipelined: bool) -> bool:
        if pipelined:
            return self.used_cpu + req.cpu_milli <= self.cpu and self.used_memory + req.memory_mib <= self.memory
        return (
            self.used_cpu + self.rel_cpu + req.cpu_milli <= self.cpu
            and self.used_memory + self.rel_memory + req.memory_mib <= self.memory
        )

    def free_whole(self, pipelined: bool) -> int:
        return self.summary()[1 if pipelined else 0]

    def could_host(self, req: Request, pipelined: bool) -> bool:
        """Cheap necessary condition on GPUs (devices of any model) and host resources."""
        if not self.fits_host(req, pipelined):
            return False
        s = self.summary()
        if req.gpus:
            return s[1 if pipelined else 0] >= req.gpus
        if req.gpu_milli:
            return s[3 if pipelined else 2] >= req.gpu_milli
        if req.gpu_memory_mib:
            return s[3 if pipelined else 2] > 0
        return True

    def gpu_milli_free(self) -> int:
        return sum(d.free_milli() for d in self.devices)


class WorkloadState:
    __slots__ = ("bound", "idx", "milli", "pipelined", "placements", "pool_idx", "queue", "state", "w")

    def __init__(self, w: Workload, idx: int, queue: int) -> None:
        self.w = w
        self.idx = idx
        self.queue = queue
        self.state = w.state
        self.placements: tuple[Placement, ...] = w.placements
        self.pool_idx = -1
        self.milli = 0
        """GPU milli charged to its project while placed."""
        self.bound = False
        """Placed by this cycle (to be bound now, or pipelined behind evictions)."""
        self.pipelined = False


@dataclass
class QueueTree:
    queues: list[Queue]
    index: dict[str, int]
    chain: list[tuple[int, ...]]
    """For each queue: itself, then its ancestors up to the root."""
    children: list[list[int]]
    roots: list[int]


def build_tree(queues: tuple[Queue, ...]) -> QueueTree:
    ordered = sorted(queues, key=lambda q: q.name)
    index = {q.name: i for i, q in enumerate(ordered)}
    if len(index) != len(ordered):
        raise ValueError("queue names must be unique")
    children: list[list[int]] = [[] for _ in ordered]
    roots: list[int] = []
    for i, q in enumerate(ordered):
        if q.parent is None:
            roots.append(i)
        elif q.parent not in index:
            raise ValueError(f"queue {q.name!r} names an unknown parent {q.parent!r}")
        else:
            children[index[q.parent]].append(i)
    chain: list[tuple[int, ...]] = []
    for i in range(len(ordered)):
        path = [i]
        seen = {i}
        p = ordered[i].parent
        while p is not None:
            j = index[p]
            if j in seen:
                raise ValueError(f"queue {ordered[i].name!r} is part of a cycle")
            seen.add(j)
            path.append(j)
            p = ordered[j].parent
        chain.append(tuple(path))
    return QueueTree(ordered, index, chain, children, roots)


@dataclass
class WorkingState:
    """Nodes, queue usage and workloads as this cycle has changed them so far."""

    tree: QueueTree
    pools: list[str]
    nodes: list[NodeState]
    node_by_name: dict[str, NodeState]
    workloads: list[WorkloadState]
    now: float
    used: list[list[int]]
    """Queue index -> pool index -> GPU milli charged (running, bound or pipelined)."""
    np_used: list[list[int]]
    """The non-preemptible part of `used`."""
    exclusive: list[bool] = field(default_factory=list)
    """Pool index -> whether its devices may not be shared across projects."""
    host_used: list[list[list[int]]] = field(default_factory=list)
    """Queue index -> pool index -> [CPU, memory, non-preemptible CPU, non-preemptible memory] charged."""
    evictions: list[Eviction] = field(default_factory=list)
    dirty: set[int] = field(default_factory=set)
    """Nodes changed since the placement index last looked."""
    generation: int = 0
    """Bumped by every eviction and its undo: quota-derived caches key on it."""
    _journal: list[Callable[[], None]] = field(default_factory=list)

    # -- transactions ------------------------------------------------------------------------------

    def checkpoint(self) -> int:
        return len(self._journal)

    def rollback(self, checkpoint: int) -> None:
        while len(self._journal) > checkpoint:
            self._journal.pop()()

    def commit(self) -> None:
        """Forget the undo log: what was done is kept. Only the outermost caller commits."""
        self._journal.clear()

    # -- changes -----------------------------------------------------------------------------------

    def place(self, ws: WorkloadState, placements: tuple[Placement, ...], pipelined: bool) -> None:
        pool_idx = self.node_by_name[placements[0].node].pool_idx if placements else 0
        milli = 0
        for p in placements:
            node = self.node_by_name[p.node]
            self._occupy(node, ws, p, +1, release=False)
            milli += sum(d.milli for d in p.devices)
        old = (ws.state, ws.placements, ws.pool_idx, ws.milli, ws.bound, ws.pipelined)
        ws.state, ws.placements, ws.pool_idx, ws.milli = State.RUNNING, placements, pool_idx, milli
        ws.bound, ws.pipelined = True, pipelined
        self._charge(ws, +1)

        def undo() -> None:
            self._charge(ws, -1)
            for p in placements:
                self._occupy(self.node_by_name[p.node], ws, p, -1, release=False)
            ws.state, ws.placements, ws.pool_idx, ws.milli, ws.bound, ws.pipelined = old

        self._journal.append(undo)

    def adopt(self, ws: WorkloadState) -> None:
        """Count a workload the snapshot says is running or releasing (at build time, not journaled)."""
        release = ws.state is State.RELEASING
        for p in ws.placements:
            node = self.node_by_name.get(p.node)
            if node is not None:
                self._occupy(node, ws, p, +1, release=release)
        if ws.placements and ws.placements[0].node in self.node_by_name:
            ws.pool_idx = self.node_by_name[ws.placements[0].node].pool_idx
        ws.milli = sum(d.milli for p in ws.placements for d in p.devices)
        if not release and ws.pool_idx >= 0:
            self._charge(ws, +1)

    def hold(self, ws: WorkloadState, p: Placement) -> None:
        """Occupy one member's placement while the rest of its gang is being placed."""
        node = self.node_by_name[p.node]
        self._occupy(node, ws, p, +1, release=False)
        self._journal.append(lambda: self._occupy(node, ws, p, -1, release=False))

    def unhold(self, ws: WorkloadState, p: Placement) -> None:
        node = self.node_by_name[p.node]
        self._occupy(node, ws, p, -1, release=False)
        self._journal.append(lambda: self._occupy(node, ws, p, +1, release=False))

    def evict(self, ws: WorkloadState, eviction: Eviction) -> None:
        """Running -> releasing: its capacity stays held but is no longer charged to its project."""
        assert ws.state is State.RUNNING and not ws.bound
        for p in ws.placements:
            node = self.node_by_name.get(p.node)
            if node is not None:
                self._occupy(node, ws, p, -1, release=False)
                self._occupy(node, ws, p, +1, release=True)
        self._charge(ws, -1)
        ws.state = State.RELEASING
        self.evictions.append(eviction)
        self.generation += 1

        def undo() -> None:
            self.generation += 1
            self.evictions.pop()
            ws.state = State.RUNNING
            self._charge(ws, +1)
            for p in ws.placements:
                node = self.node_by_name.get(p.node)
                if node is not None:
                    self._occupy(node, ws, p, -1, release=True)
                    self._occupy(node, ws, p, +1, release=False)

        self._journal.append(undo)

    def _charge(self, ws: WorkloadState, sign: int) -> None:
        if ws.pool_idx < 0:
            return
        amount = sign * ws.milli
        members = len(ws.placements)
        cpu, memory = sign * ws.w.request.cpu_milli * members, sign * ws.w.request.memory_mib * members
        nonpreemptible = not ws.w.preemptible
        for q in self.tree.chain[ws.queue]:
            self.used[q][ws.pool_idx] += amount
            host = self.host_used[q][ws.pool_idx]
            host[0] += cpu
            host[1] += memory
            if nonpreemptible:
                self.np_used[q][ws.pool_idx] += amount
                host[2] += cpu
                host[3] += memory

    def _occupy(self, node: NodeState, ws: WorkloadState, p: Placement, sign: int, release: bool) -> None:
        req = ws.w.request
        whole = req.gpus > 0
        node.version += 1
        node.signature = -1
        self.dirty.add(node.idx)
        if release:
            node.rel_cpu += sign * req.cpu_milli
            node.rel_memory += sign * req.memory_mib
            for share in p.devices:
                d = node.device(share.index)
                d.rel += sign * share.milli
                d.rel_mem += sign * share.memory_mib
                if whole:
                    d.rel_whole = sign > 0
                elif d.exclusive:
                    _count(d.rel_holders, ws.queue, sign)
                    _count(node.rel_sharers, ws.queue, sign)
            return
        node.used_cpu += sign * req.cpu_milli
        node.used_memory += sign * req.memory_mib
        for share in p.devices:
            d = node.device(share.index)
            d.used += sign * share.milli
            d.used_mem += sign * share.memory_mib
            if whole:
                d.whole = sign > 0
            elif d.exclusive:
                _count(d.holders, ws.queue, sign)
                _count(node.sharers, ws.queue, sign)
        count = node.residents.get(ws.idx, 0) + sign
        if count:
            node.residents[ws.idx] = count
        else:
            node.residents.pop(ws.idx, None)


def _count(counts: dict[int, int], key: int, sign: int) -> None:
    n = counts.get(key, 0) + sign
    if n:
        counts[key] = n
    else:
        del counts[key]
