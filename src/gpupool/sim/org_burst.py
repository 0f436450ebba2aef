"""Bursting to a GPU cloud in the organisation simulation: the core's `burst.plan` decides, this module acts.

The simulator plays the cloud and the control plane's part: at a tick where the core scheduled or a burst node
is held, it asks `plan` with the snapshot the core just decided on and the reasons it gave. Asked nodes join the
cluster `delay_s` later, drained nodes take no new work, released ones leave at once, and the work `plan` stops is
requeued as a preemption. Each department's nodes form a pool of their own (`pool_of`): its quota there is what it
rents (deserved and limit both) and every other department's limit there is 0, so only its work runs on the nodes
it pays for, and only preemptible work (its projects have no deserved quota there).

**Billing** runs from the ask to the release, as clouds bill from when an instance exists, whether or not it is
ready or busy: a node of `node_gpus` GPUs held for s seconds costs node_gpus x s GPU-seconds at the pool's price,
summed per department and rounded up to a micro-dollar once (`cost_micro`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from gpupool.core import Device, Node, PendingCode, Placement, Queue, Snapshot
from gpupool.core.burst import BurstNode, BurstPool, DepartmentBurst, accrued, cost_micro, plan
from gpupool.core.burst_pools import department_quotas, pool_of
from gpupool.models.clusters import MICRO

BURST_POOL = "burst"
"""The burst pool's name as `plan` knows it (the core nodes' pools are per department: `pool_of`)."""


@dataclass(frozen=True)
class BurstSettings:
    """One burst pool and every department's settings for a run."""

    pool: BurstPool
    wait_threshold_s: float | None
    budget_micro: int | None
    """Each department's budget for the run (already pro-rated by the caller); None: no cap."""
    hours_ahead: float = 1.0
    """The look-ahead a budget is checked over (`plan`)."""
    stop_at_budget: bool = True
    """Stop the work on a department's nodes once its budget is spent (`DepartmentBurst.stop_at_budget`)."""
    paced_over_s: float | None = None
    """The budget accrues evenly over this many seconds from the start of the run (`accrued`); None: all of it is
    available from the start."""


@dataclass
class _Held:
    """One burst node asked for: its lifecycle as the cloud sees it, and what runs on it."""

    name: str
    department: str
    asked_at: float
    ready_at: float | None = None
    idle_since: float | None = None
    drained: bool = False
    members: int = 0
    """Members of running workloads placed on it."""

    def as_core(self) -> BurstNode:
        return BurstNode(self.name, BURST_POOL, self.department, self.asked_at, self.ready_at, self.idle_since)


@dataclass
class Bill:
    """One node's rental: from the ask to the release (None while held)."""

    node: str
    department: str
    asked_at: float
    released_at: float | None = None

    def gpu_seconds(self, node_gpus: int, now: float) -> float:
        end = self.released_at if self.released_at is not None else now
        return node_gpus * (end - self.asked_at)


@dataclass
class BurstCloud:
    """The burst nodes of one run, their bills, and the core nodes and quotas they add to each snapshot."""

    settings: BurstSettings
    departments: tuple[str, ...]
    held: dict[str, _Held] = field(default_factory=dict)
    bills: dict[str, Bill] = field(default_factory=dict)
    """Every node asked for, by name, in the order asked."""
    asked: int = 0
    released: int = 0
    refusals: dict[str, int] = field(default_factory=dict)
    """Plans in which a department's waiting work got no node, per refusal code."""
    _nodes: tuple[Node, ...] | None = None

    # -- what the core sees ------------------------------------------------------------------------

    def nodes(self) -> tuple[Node, ...]:
        """The ready burst nodes as core nodes; drained ones are unschedulable."""
        if self._nodes is None:
            p = self.settings.pool
            devices = tuple(Device(i, p.gpu_model, p.gpu_memory_mib) for i in range(p.node_gpus))
            self._nodes = tuple(
                Node(h.name, pool_of(h.department), p.cpu_milli, p.memory_mib, devices, schedulable=not h.drained)
                for h in self.held.values()
                if h.ready_at is not None
            )
        return self._nodes

    def queues(self, queues: Sequence[Queue]) -> tuple[Queue, ...]:
        """The organisation's queues, each department's quota in the burst pool being the GPUs it has there."""
        gpus: dict[str, int] = {}
        for h in self.held.values():
            if h.ready_at is not None:
                gpus[h.department] = gpus.get(h.department, 0) + self.settings.pool.node_gpus
        return department_quotas(queues, gpus)

    def is_burst(self, node: str) -> bool:
        return node in self.held

    # -- acting --------------------------------------------------------------------------------------

    def step(
        self, snapshot: Snapshot, reasons: Mapping[str, PendingCode], waiting_since: Mapping[str, float]
    ) -> tuple[list[tuple[float, str]], tuple[str, ...]]:
        """Ask `plan` and carry out its nodes' part at `snapshot.now`. Returns the (time, node) of each node asked
        for, when it will be ready, and the workloads to stop (the simulator stops them)."""
        now = snapshot.now
        s = self.settings
        pace = None
        if s.budget_micro is not None and s.paced_over_s is not None:
            pace = accrued(s.budget_micro, now, s.paced_over_s)
        departments = {
            d: DepartmentBurst(
                d, s.wait_threshold_s, s.budget_micro, self.spent_micro(d, now), s.stop_at_budget, accrued_micro=pace
            )
            for d in self.departments
        }
        held = [h.as_core() for h in self.held.values()]
        decided = plan(
            snapshot,
            (s.pool,),
            departments,
            held,
            reasons=reasons,
            waiting_since=waiting_since,
            hours_ahead=s.hours_ahead,
        )
        for name in decided.releases:
            del self.held[name]
            self.bills[name].released_at = now
            self.released += 1
        drains = set(decided.drains)
        for h in self.held.values():
            h.drained = h.name in drains
        ready: list[tuple[float, str]] = []
        for request in decided.requests:
            for _ in range(request.nodes):
                self.asked += 1
                name = f"burst-{self.asked:05d}"
                self.held[name] = _Held(name, request.department, now)
                self.bills[name] = Bill(name, request.department, now)
                ready.append((now + s.pool.delay_s, name))
        for _, code in decided.refused:
            self.refusals[code] = self.refusals.get(code, 0) + 1
        self._nodes = None
        return ready, decided.evictions

    def ready(self, name: str, now: float) -> None:
        h = self.held.get(name)
        if h is not None and h.ready_at is None:
            h.ready_at = h.idle_since = now
            self._nodes = None

    def started(self, placements: Iterable[Placement]) -> None:
        for p in placements:
            if (h := self.held.get(p.node)) is not None:
                h.members += 1
                h.idle_since = None

    def stopped(self, placements: Iterable[Placement], now: float) -> None:
        for p in placements:
            if (h := self.held.get(p.node)) is not None:
                h.members -= 1
                if h.members == 0:
                    h.idle_since = now

    # -- bills -----------------------------------------------------------------------------------------

    def gpu_seconds(self, department: str, now: float) -> float:
        """GPU-seconds of the department's burst nodes, released or held, from each ask until `now`."""
        gpus = self.settings.pool.node_gpus
        return sum(b.gpu_seconds(gpus, now) for b in self.bills.values() if b.department == department)

    def spent_micro(self, department: str, now: float) -> int:
        return cost_micro(1, self.settings.pool.price_micro, Fraction(self.gpu_seconds(department, now)) / 3600)

    def figures(self, now: float) -> dict[str, Any]:
        """What the run rented and paid, per department and in all, at `now` (the end of the run)."""
        by = {d: self.spent_micro(d, now) for d in self.departments}
        budget = self.settings.budget_micro
        return {
            "cost_usd": sum(by.values()) / MICRO,
            "cost_usd_by_department": {d: v / MICRO for d, v in by.items()},
            "budget_usd_per_department": None if budget is None else budget / MICRO,
            "gpu_hours": round(sum(self.gpu_seconds(d, now) for d in self.departments) / 3600, 3),
            "nodes_asked": self.asked,
            "nodes_released": self.released,
            "refusals": dict(sorted(self.refusals.items())),
        }
