"""One cycle's session: the working state built from a snapshot, fair shares, and what each action found."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from operator import attrgetter

import numpy as np

from gpupool.core import fairshare
from gpupool.core.config import SchedulerConfig
from gpupool.core.decision import Bind, Pending, PendingCode, QueueShare
from gpupool.core.model import MILLI, Request, Snapshot, State
from gpupool.core.placement import baselines as _baselines  # noqa: F401  (registers the published baselines)
from gpupool.core.placement import fgd as _fgd  # noqa: F401  (registers the fgd and gpupool policies)
from gpupool.core.placement.index import IntArray
from gpupool.core.placement.memo import Memo
from gpupool.core.placement.models import ModelDemand, model_demand, model_pressure
from gpupool.core.placement.placer import Placer
from gpupool.core.placement.policies import PolicyContext, TypicalMix, make_policy, popular_shapes
from gpupool.core.state import NodeState, WorkingState, WorkloadState, build_tree

_fields = attrgetter(*(f.name for f in fields(Request)))
"""A request's fields as a tuple: equal exactly when the requests are, and hashed without Python calls."""


@dataclass
class Session:
    state: WorkingState
    placer: Placer
    config: SchedulerConfig
    fair: list[list[int]]
    """Queue index -> pool index -> fair share in milli-GPU."""
    demand: list[list[int]]
    deserved: list[list[int]]
    """Queue index -> pool index -> deserved quota in milli-GPU."""
    pending: dict[int, Pending] = field(default_factory=dict)
    """Workload index -> why it is still pending (the latest action's word)."""
    unknown: list[Pending] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)
    _hosts: dict[int, IntArray] | None = None
    _classes: list[int] | None = None

    def classes(self) -> list[int]:
        """Workload index -> its class: a small number shared by the workloads of one project with the same
        request, pools, clusters, GPU models, gang size and preemptibility, which every action treats alike."""
        if self._classes is None:
            ids: dict[tuple[object, ...], int] = {}
            self._classes = [
                ids.setdefault(key, len(ids))
                for ws in self.state.workloads
                for w in (ws.w,)
                for key in (
                    (ws.queue, _fields(w.request), w.pools, w.clusters, w.gpu_models, w.gang_size, w.preemptible),
                )
            ]
        return self._classes

    def hosts(self, queues: Iterable[int]) -> IntArray:
        """Nodes hosting work that was running at the start of the cycle in any of `queues`, ascending."""
        if self._hosts is None:
            by_queue: dict[int, set[int]] = {}
            for ws in self.state.workloads:
                if ws.state is State.RUNNING:
                    for p in ws.placements:
                        node = self.state.node_by_name.get(p.node)
                        if node is not None:
                            by_queue.setdefault(ws.queue, set()).add(node.idx)
            self._hosts = {q: np.array(sorted(s), dtype=np.int64) for q, s in by_queue.items()}
        parts = [self._hosts[q] for q in queues if q in self._hosts]
        if not parts:
            return np.zeros(0, dtype=np.int64)
        return parts[0] if len(parts) == 1 else np.unique(np.concatenate(parts))

    def waiting(self) -> list[WorkloadState]:
        """Pending workloads not yet placed or pipelined this cycle, in workload order."""
        return [ws for ws in self.state.workloads if ws.state is State.PENDING]

    def bound(self) -> tuple[Bind, ...]:
        return tuple(Bind(ws.w.id, ws.placements) for ws in self.state.workloads if ws.bound and not ws.pipelined)

    def shares(self) -> tuple[QueueShare, ...]:
        tree, out = self.state.tree, []
        for q, queue in enumerate(tree.queues):
            for p, pool in enumerate(self.state.pools):
                quota = queue.quota(pool)
                out.append(
                    QueueShare(
                        queue.name,
                        pool,
                        quota.deserved,
                        self.fair[q][p],
                        self.state.used[q][p],
                        quota.limit,
                        self.demand[q][p],
                    )
                )
        return tuple(out)


def open_session(snapshot: Snapshot, config: SchedulerConfig, memo: Memo | None = None) -> Session:
    if memo is not None:
        memo.bound()
    tree = build_tree(snapshot.queues)
    nodes_sorted = sorted(snapshot.nodes, key=lambda n: n.name)
    pools = sorted({n.pool for n in nodes_sorted})
    pool_index = {p: i for i, p in enumerate(pools)}
    exclusive = [not snapshot.pool(p).share_across_projects for p in pools]
    nodes = [NodeState(n, i, pool_index[n.pool], exclusive[pool_index[n.pool]]) for i, n in enumerate(nodes_sorted)]
    if len({n.name for n in nodes}) != len(nodes):
        raise ValueError("node names must be unique")
    workloads: list[WorkloadState] = []
    unknown: list[Pending] = []
    for w in sorted(snapshot.workloads, key=lambda w: w.id):
        q = tree.index.get(w.project)
        if q is None:
            if w.state is State.PENDING:
                unknown.append(Pending(w.id, PendingCode.NEVER_FITS, f"project {w.project!r} does not exist"))
            continue
        if tree.children[q]:
            if w.state is State.PENDING:
                unknown.append(Pending(w.id, PendingCode.NEVER_FITS, f"{w.project!r} is a department, not a project"))
            continue
        workloads.append(WorkloadState(w, len(workloads), q))
    if len({ws.w.id for ws in workloads}) != len(workloads):
        raise ValueError("workload ids must be unique")
    n_q, n_p = len(tree.queues), len(pools)
    state = WorkingState(
        tree=tree,
        pools=pools,
        nodes=nodes,
        node_by_name={n.name: n for n in nodes},
        workloads=workloads,
        now=snapshot.now,
        used=[[0] * n_p for _ in range(n_q)],
        np_used=[[0] * n_p for _ in range(n_q)],
        host_used=[[[0, 0, 0, 0] for _ in range(n_p)] for _ in range(n_q)],
        exclusive=exclusive,
    )
    for ws in workloads:
        if ws.state is not State.PENDING:
            state.adopt(ws)
    fair, demand = _fair_shares(state)
    ctx = PolicyContext(
        mix=config.typical_mix if config.typical_mix is not None else derive_mix(snapshot, config.mix_coverage_pct),
        seed=config.seed,
        max_cpu=max((n.cpu for n in nodes), default=1),
        max_gpus=max((len(n.devices) for n in nodes), default=1),
        memo=memo or Memo(),
        requests_on=lambda node: [workloads[i].w.request for i, n in node.residents.items() for _ in range(n)],
        model_pressure=model_pressure(
            _model_capacity(nodes),
            config.model_demand if config.model_demand is not None else derive_model_demand(snapshot),
        ),
    )
    placer = Placer(state, make_policy(config.policy, ctx))
    deserved = [[q.quota(p).deserved for p in pools] for q in tree.queues]
    return Session(state, placer, config, fair, demand, deserved, unknown=unknown)


def _fair_shares(state: WorkingState) -> tuple[list[list[int]], list[list[int]]]:
    n_q, n_p = len(state.tree.queues), len(state.pools)
    own = [[0] * n_p for _ in range(n_q)]
    for ws in state.workloads:
        if ws.state is State.RUNNING and ws.pool_idx >= 0:
            own[ws.queue][ws.pool_idx] += ws.milli
        elif ws.state is State.PENDING:
            want = ws.w.request.nominal_milli() * ws.w.gang_size
            for p, pool in enumerate(state.pools):
                if not ws.w.pools or pool in ws.w.pools:
                    own[ws.queue][p] += want
    capacity = [0] * n_p
    for n in state.nodes:
        if n.schedulable:
            capacity[n.pool_idx] += len(n.devices) * MILLI
        else:
            capacity[n.pool_idx] += sum(d.used for d in n.devices)
    fair = [[0] * n_p for _ in range(n_q)]
    demand = [[0] * n_p for _ in range(n_q)]
    for p, pool in enumerate(state.pools):
        d = fairshare.capped_demand(state.tree, pool, [own[q][p] for q in range(n_q)])
        f = fairshare.fair_shares(state.tree, pool, capacity[p], d)
        for q in range(n_q):
            fair[q][p] = f[q]
            demand[q][p] = d[q]
    return fair, demand


def derive_mix(snapshot: Snapshot, coverage_pct: int) -> TypicalMix:
    """The typical mix of the snapshot's own workloads."""
    return popular_shapes((w.request for w in snapshot.workloads), coverage_pct)


def derive_model_demand(snapshot: Snapshot) -> ModelDemand:
    """The GPU work of the snapshot's own workloads, by the models each accepts. Without pinned work there
    is no pressure to work out, so the common case costs one pass over the workloads and no more."""
    if not any(w.gpu_models for w in snapshot.workloads):
        return ()
    return model_demand((w.gpu_models, w.request.nominal_milli() * w.gang_size) for w in snapshot.workloads)


def _model_capacity(nodes: list[NodeState]) -> dict[str, int]:
    capacity: dict[str, int] = defaultdict(int)
    for n in nodes:
        if n.schedulable:
            for d in n.devices:
                capacity[d.model] += MILLI
    return capacity
