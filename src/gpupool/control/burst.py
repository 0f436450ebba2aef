"""The hub's burst loop: it rents GPU nodes for departments whose work has waited too long, within their budgets,
and gives them back once idle. The core decides (`gpupool.core.burst.plan`, as in the simulator); this module
gathers its inputs from the store and carries out its plan with each burst cluster's provider.

Every step runs in the leader's cycle, every `interval_s`:

1. **Follow** what was asked (`BurstFollow`): asks still `asking` are made (again: idempotent by name), requests the
   provider has provisioned get a node of their cluster (attributed in order, and labelled so), failed, revoked or
   vanished ones are given back, and nodes `releasing` are given back (again).
2. **Plan** with the cycle's snapshot and the reasons its decision gave: the departments' settings and this month's
   spending (`gpupool.store.burst_bills`), the nodes held, and when each waiting workload started waiting.
3. **Write the plan down** before acting on it: a row per node to ask for (`asking`), `releasing` for nodes to give
   back, the refusals on the departments; then act (step 1's calls). A crash between the two leaves rows that say
   "maybe done", which the next step finishes; a node without a row was never asked for.

Between steps the cycles see burst nodes through `reserve`: each node in its department's own pool, and nodes not
yet attributed, drained or given back taking no new work. Work on the nodes of a department whose spending reached
its budget is stopped (requeued) by the next cycle (`stops`)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.backends.kubernetes.provisioning import BurstProvider
from gpupool.control.burst_follow import BurstFollow
from gpupool.core import Decision, Snapshot
from gpupool.core.burst import BurstNode, BurstPlan, BurstPool, DepartmentBurst, accrued, plan
from gpupool.core.burst_pools import reserve
from gpupool.core.model import State
from gpupool.lifecycle import burst as burst_lifecycle
from gpupool.lifecycle import transitions as lifecycle
from gpupool.lifecycle.phases import HELD, LIVE, OPEN, QUEUED, BurstEnd, BurstPhase, StopReason
from gpupool.models.clusters import ClusterStatus
from gpupool.store.burst_bills import billed, month, spent_micro
from gpupool.store.snapshot import row_id
from gpupool.store.tables import BurstNodeRow, ClusterRow, EventRow, QueueRow, WorkloadRow

log = logging.getLogger("gpupool.burst")

Providers = Callable[[ClusterRow], BurstProvider | None]
"""A burst cluster's provider (its ProvisioningRequests), built from its row; None where it has none."""


@dataclass
class BurstView:
    """What the cycles apply to each snapshot between steps."""

    clusters: frozenset[str] = frozenset()
    """The burst clusters."""
    owners: dict[str, str] = field(default_factory=dict)
    """Attributed nodes (hub names) and the department that pays for each."""
    drained: set[str] = field(default_factory=set)
    prices: dict[str, int] = field(default_factory=dict)
    """Attributed nodes and their price per GPU-hour (micro-dollars), for usage reports."""


class Bursting:
    def __init__(self, providers: Providers, interval_s: float = 10.0, lookahead_s: float = 3600.0) -> None:
        self.follow = BurstFollow(providers)
        self.interval_s = interval_s
        self.lookahead_s = lookahead_s
        self.view = BurstView()
        self._loaded = False
        self._next = 0.0
        self._stops: dict[int, str] = {}
        """Workloads to stop (their department's budget is spent), with the department."""
        self.seen: dict[str, bool] = {}
        """The burst clusters' nodes in the last snapshot, as their cluster offers them (schedulable or not)."""

    # -- between steps ---------------------------------------------------------------------------------------

    def shape(self, s: Session, snapshot: Snapshot) -> Snapshot:
        """The snapshot as the scheduler must see burst nodes (`reserve`)."""
        if not self._loaded:
            self._load(s)
        if not self.view.clusters:
            return snapshot
        self.seen = {n.name: n.schedulable for n in snapshot.nodes if n.cluster in self.view.clusters}
        closed = {n for n in self.seen if n not in self.view.owners} | self.view.drained
        return reserve(snapshot, self.view.owners, closed)

    def stops(self, rows: Iterable[WorkloadRow], now: float) -> list[EventRow]:
        """Stop (requeue) the work the last step found on the nodes of a department whose budget is spent."""
        if not self._stops:
            return []
        events = []
        for row in rows:
            department = self._stops.get(row.id)
            if department is None or row.state not in LIVE:
                continue
            event = lifecycle.request_stop(row, StopReason.BURST_BUDGET, now, department=department)
            if event is not None:
                log.info("workload %d: stopped, department %s reached its burst budget", row.id, department)
                events.append(event)
        self._stops = {}
        return events

    def due(self, now: float) -> bool:
        return now >= self._next

    # -- a step ----------------------------------------------------------------------------------------------

    def step(
        self,
        s: Session,
        snapshot: Snapshot,
        decision: Decision,
        rows: Mapping[int, WorkloadRow],
        reached: Callable[[str], bool],
        commit: Callable[[Session], None],
        now: float,
    ) -> bool:
        """Follow, plan, write the plan down, act; whether there was anything to do (a burst cluster, or a burst
        node to follow). `snapshot` is the one `shape` returned this cycle, `decision`
        the core's on it; `reached(cluster)`: whether the cluster answered its last heartbeat."""
        self._next = now + self.interval_s
        every = {c.name: c for c in s.scalars(select(ClusterRow).order_by(ClusterRow.name))}
        clusters = {name: c for name, c in every.items() if c.burst}
        held = list(s.scalars(select(BurstNodeRow).where(BurstNodeRow.phase.in_(sorted(OPEN)))))
        if not clusters and not held and not self.view.clusters:
            return False
        self.follow.follow(held, every, reached, self.seen, now)
        commit(s)
        busy = _busy(snapshot, decision)
        for row in held:
            if burst_lifecycle.phase(row) is BurstPhase.READY:
                row.idle_since = None if row.node in busy else (row.idle_since or now)
        planned = {
            name: c
            for name, c in clusters.items()
            if c.status == ClusterStatus.UP and not c.draining and reached(name) and self.follow.provider(c) is not None
        }
        departments = self._departments(s, now)
        nodes = {_node_name(r): r for r in held if burst_lifecycle.phase(r) in HELD and r.cluster in planned}
        decided = plan(
            snapshot,
            [_pool(c) for c in planned.values()],
            departments,
            [_core_node(name, r) for name, r in sorted(nodes.items())],
            reasons={p.workload: p.code for p in decision.pending},
            waiting_since=_waiting_since(snapshot, rows),
            hours_ahead=self.lookahead_s / 3600,
        )
        self._write(s, snapshot, decided, nodes, planned, departments, now)
        commit(s)
        opened = list(s.scalars(select(BurstNodeRow).where(BurstNodeRow.phase.in_(sorted(OPEN)))))
        self.follow.act(opened, every, reached, now)
        commit(s)
        self._view(opened, set(clusters), {nodes[n].node for n in decided.drains if nodes[n].node})
        return True

    def _departments(self, s: Session, now: float) -> dict[str, DepartmentBurst]:
        start, end = month(now)
        bills: dict[str, list[BurstNodeRow]] = {}
        for row in billed(s, start, now):  # one read for every department's month
            bills.setdefault(row.department, []).append(row)
        out = {}
        for q in s.scalars(select(QueueRow).where(QueueRow.parent_id.is_(None)).order_by(QueueRow.name)):
            if q.burst_budget_micro is None:
                continue
            pace = accrued(q.burst_budget_micro, now - start, end - start) if q.burst_paced else None
            spent = spent_micro(bills.get(q.name, []), start, now)
            out[q.name] = DepartmentBurst(
                q.name, q.burst_after_s, q.burst_budget_micro, spent, q.burst_stop_at_budget, accrued_micro=pace
            )
        return out

    def _write(
        self,
        s: Session,
        snapshot: Snapshot,
        decided: BurstPlan,
        nodes: Mapping[str, BurstNodeRow],
        planned: Mapping[str, ClusterRow],
        departments: Mapping[str, DepartmentBurst],
        now: float,
    ) -> None:
        """The plan, written down: the releases' intents, a row per node to ask for, the departments' refusals,
        and the work to stop."""
        for name in decided.releases:
            row = nodes[name]
            cluster = (planned[row.cluster].burst or {}) if row.cluster in planned else {}
            if row.department not in departments:
                why = BurstEnd.UNWANTED
            elif row.idle_since is not None and now - row.idle_since >= float(cluster.get("idle_release_s", 0)):
                why = BurstEnd.IDLE
            else:
                why = BurstEnd.BUDGET
            log.info("giving back burst node %s (%s) of %s: %s", row.name, row.node, row.department, why.value)
            burst_lifecycle.release(row, why)
        for request in decided.requests:
            c = planned[request.pool]
            burst = c.burst or {}
            ids = [row_id(w) for w in request.for_workloads]
            for _ in range(request.nodes):
                name = f"gpupool-{uuid.uuid4().hex[:16]}"
                s.add(burst_lifecycle.asking(
                    name, c.name, request.department, int(burst["node_gpus"]), int(burst["price_micro"]), ids, now
                ))  # fmt: skip
            log.info("asking %s for %d node(s) for %s: workloads %s", c.name, request.nodes, request.department, ids)
        refused = dict(decided.refused)
        for q in s.scalars(select(QueueRow).where(QueueRow.parent_id.is_(None))):
            code = refused.get(q.name)
            if code != q.burst_refused:
                q.burst_refused, q.burst_refused_at = code, (now if code else None)
        by_node = {r.node: r.department for r in nodes.values() if r.node}
        self._stops = {}
        for w in snapshot.workloads:
            if w.id in decided.evictions:
                paying = sorted({by_node[p.node] for p in w.placements if p.node in by_node})
                self._stops[row_id(w.id)] = ", ".join(paying)

    def _view(self, rows: list[BurstNodeRow], clusters: set[str], drained: set[str | None]) -> None:
        ready = [r for r in rows if burst_lifecycle.phase(r) is BurstPhase.READY and r.node]
        releasing = {r.node for r in rows if burst_lifecycle.phase(r) is BurstPhase.RELEASING and r.node}
        self.view = BurstView(
            frozenset(clusters),
            {str(r.node): r.department for r in ready},
            {n for n in drained if n} | releasing,
            {str(r.node): r.price_micro for r in ready},
        )

    def _load(self, s: Session) -> None:
        """The view from the store, before the first step (a restarted hub)."""
        self._loaded = True
        clusters = {c.name for c in s.scalars(select(ClusterRow)) if c.burst}
        rows = list(s.scalars(select(BurstNodeRow).where(BurstNodeRow.phase.in_(sorted(OPEN)))))
        self._view(rows, clusters, set())


def _node_name(row: BurstNodeRow) -> str:
    """A held node's name in the plan: its node's where it has one (the snapshot's placements name it), else its
    request's."""
    return row.node or row.name


def _core_node(name: str, row: BurstNodeRow) -> BurstNode:
    return BurstNode(name, row.cluster, row.department, row.asked_at, row.ready_at, row.idle_since)


def _pool(c: ClusterRow) -> BurstPool:
    b = c.burst or {}
    return BurstPool(
        c.name, int(b["price_micro"]), float(b["delay_s"]), int(b["max_gpus"]), int(b["node_gpus"]),
        float(b["idle_release_s"]), gpu_model=str(b.get("gpu_model") or ""), cluster=c.name,
    )  # fmt: skip


def _busy(snapshot: Snapshot, decision: Decision) -> set[str]:
    """Nodes with work: running in the snapshot, or just placed by its decision."""
    busy = {p.node for w in snapshot.workloads if w.state is not State.PENDING for p in w.placements}
    return busy | {p.node for b in decision.binds for p in b.placements}


def _waiting_since(snapshot: Snapshot, rows: Mapping[int, WorkloadRow]) -> dict[str, float]:
    """When each queued workload last began to wait: its submit, or the end of its last attempt (a requeued one
    keeps its submit time, which orders the queue, but has waited only since it was stopped)."""
    out = {}
    for w in snapshot.workloads:
        row = rows.get(row_id(w.id))
        if w.state is not State.PENDING or row is None or row.state not in QUEUED:
            continue
        ended = [float(a["ended"]) for a in row.attempts or [] if a.get("ended") is not None]
        out[w.id] = max([row.queued_at, *ended])
    return out
