"""Burst pools: when to rent GPU nodes from a cloud, and when to give them back. Pure and deterministic.

A burst pool is capacity rented by the node (`BurstPool`), with a price per GPU-hour, a delay between asking and
having it, and a maximum size. The live control plane and the simulator both call `plan` with the same inputs a
scheduling cycle has (the core `Snapshot`, plus what only the caller knows: the burst nodes asked for, and each
department's settings and spending so far), so what the simulator reports about bursting holds for the product.

The rules, each for a reason:

- **Demand** is pending work that has waited at least its department's threshold since it last started waiting (a
  department without one never bursts): capacity is rented for work the on-premises cluster could not start in
  time, not for every arrival, nor for work the scheduler has just moved.
  Work that a burst node could not hold (too big, restricted to other pools, models or clusters, or asking for no
  GPU) is no demand for it. Oldest first, then by id, so the longest waits are served first.
- **Supply already coming counts**: a department's nodes still provisioning, or ready and idle, take its demand
  before a new node is asked for, so one need is never asked for twice.
- **Budgets are checked before an ask**: an ask is allowed while the department's spending so far, plus the cost of
  every node it holds or awaits for `hours_ahead`, plus the new nodes' cost for as long, stays within its budget;
  past that the department gets what the budget allows (perhaps nothing) and a refusal the product can show.
- **Budgets are paced**: where the caller says how much of the budget has accrued so far (`accrued`: evenly over
  the period), asks are checked against that rather than the whole budget, so a busy first day cannot spend the
  month and leave nothing for the rest of it.
- **A department nearing its budget drains**: its nodes take no new work (the caller cordons them), the newest
  first, an hour of spending apart, the oldest once spending reaches the budget (or its pace); they go back once
  idle.
- **A budget is a cap** (unless the department says otherwise): once its spending has reached it, the work on its
  nodes is stopped (evicted and requeued, as a preemption: it keeps its last checkpoint) so that the nodes empty
  and go back. Without that, one long training run started on a burst node would spend many times a small
  budget. A department with `stop_at_budget` off lets running work finish, and may pass its budget by that tail.
- **Pools are tried cheapest first** (price, then name) and never grow past their maximum size, counting every
  department's nodes.
- **A gang's members share one pool**: like a cluster, a pool is a place a gang never spans.
- **Idle nodes go back** after the pool's `idle_release_s` (drained ones at once); a node with work on it never
  does.

Money is in integer micro-dollars (a price of $2.50 per GPU-hour is 2_500_000); a cost is rounded up to a whole
micro-dollar, computed exactly (`cost_micro`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from gpupool.core.decision import PendingCode
from gpupool.core.model import MILLI, GpuKind, Queue, Snapshot, State, Workload

OVER_BUDGET = "over-budget"
"""A refusal: the department's budget does not cover the nodes its waiting work needs."""
POOLS_FULL = "pools-full"
"""A refusal: every burst pool that could hold the work is at its maximum size."""

NOT_DEMAND: frozenset[PendingCode] = frozenset({PendingCode.OVER_LIMIT, PendingCode.WAITING_FOR_EVICTIONS})
"""Pending reasons more capacity does not answer: a hard limit caps the project wherever it runs, and work waiting
for evictions starts once they finish."""


@dataclass(frozen=True, slots=True)
class BurstPool:
    """Capacity rented from a GPU cloud, by the node."""

    name: str
    price_micro: int
    """Micro-dollars per GPU-hour."""
    delay_s: float
    """From an ask to a ready node."""
    max_gpus: int
    """The most GPUs held or asked for at once, all departments together."""
    node_gpus: int = 8
    idle_release_s: float = 600.0
    """How long a ready node stays empty before it goes back."""
    gpu_model: str = ""
    gpu_memory_mib: int = 81920
    cpu_milli: int = 96000
    memory_mib: int = 1048576
    cluster: str = ""
    """The cluster its nodes join; empty for none (work restricted to named clusters is no demand for it)."""


@dataclass(frozen=True, slots=True)
class DepartmentBurst:
    """A department's burst settings, and its spending so far this budget period (the caller sums it)."""

    department: str
    """Its name, the key it has in `plan`'s mapping: a top-level queue."""
    wait_threshold_s: float | None
    """Pending work bursts once it has waited this long; None: the department never bursts."""
    budget_micro: int | None
    """Micro-dollars for the budget period; None: no cap."""
    spent_micro: int = 0
    stop_at_budget: bool = True
    """Stop the work on its nodes once spending reaches the budget; False: let it finish (and pay for it)."""
    accrued_micro: int | None = None
    """The part of the budget the period has made available so far (`accrued`), which paces asks and drains;
    None: all of it at once."""

    @property
    def pace_micro(self) -> int | None:
        """What asks and drains are checked against: the accrued budget, never more than the budget."""
        if self.budget_micro is None:
            return None
        return self.budget_micro if self.accrued_micro is None else min(self.accrued_micro, self.budget_micro)


@dataclass(frozen=True, slots=True)
class BurstNode:
    """A burst node asked for, provisioning or ready."""

    name: str
    pool: str
    department: str
    """The department that asked for it and pays for it."""
    asked_at: float
    ready_at: float | None
    """None while it is provisioning."""
    idle_since: float | None
    """When it last became empty; None while it runs work or is provisioning."""


@dataclass(frozen=True, slots=True)
class BurstRequest:
    pool: str
    department: str
    nodes: int
    for_workloads: tuple[str, ...]
    """The waiting workloads the nodes are for, oldest first."""


@dataclass(frozen=True, slots=True)
class BurstPlan:
    requests: tuple[BurstRequest, ...] = ()
    """By department, then pool."""
    releases: tuple[str, ...] = ()
    """Nodes to give back, by name."""
    refused: tuple[tuple[str, str], ...] = ()
    """(department, code: OVER_BUDGET or POOLS_FULL) for departments whose waiting work got no node, sorted."""
    drains: tuple[str, ...] = ()
    """Nodes to take no new work (cordoned: their department's budget no longer covers them), by name."""
    evictions: tuple[str, ...] = ()
    """Running workloads to stop and requeue (their department's spending has reached its budget), by id."""


def cost_micro(gpus: int, price_micro: int, hours: float | Fraction) -> int:
    """The cost of `gpus` GPUs for `hours` hours in micro-dollars, rounded up, computed exactly (a float is taken
    at its exact binary value; pass a Fraction, such as seconds / 3600, to avoid rounding it first)."""
    return math.ceil(Fraction(gpus * price_micro) * Fraction(hours))


def accrued(budget_micro: int, elapsed_s: float, period_s: float) -> int:
    """A budget that accrues evenly over its period: what is available `elapsed_s` into it (rounded down)."""
    share = min(Fraction(1), max(Fraction(0), Fraction(elapsed_s) / Fraction(period_s)))
    return math.floor(budget_micro * share)


def department_of(queues: Sequence[Queue], project: str) -> str | None:
    """The top-level ancestor of a project (itself when it has no parent); None for an unknown project."""
    return _tops(queues).get(project)


def _tops(queues: Sequence[Queue]) -> dict[str, str]:
    """Every queue's top-level ancestor (a queue whose parent is unknown is its own top)."""
    parents = {q.name: q.parent for q in queues}
    out: dict[str, str] = {}
    for q in queues:
        name, seen = q.name, {q.name}
        while (parent := parents.get(name)) is not None and parent in parents and parent not in seen:
            name = parent
            seen.add(name)
        out[q.name] = name
    return out


def plan(
    snapshot: Snapshot,
    pools: Sequence[BurstPool],
    departments: Mapping[str, DepartmentBurst],
    nodes: Sequence[BurstNode],
    *,
    reasons: Mapping[str, PendingCode] | None = None,
    waiting_since: Mapping[str, float] | None = None,
    hours_ahead: float = 1.0,
) -> BurstPlan:
    """What to ask for, give back, drain and stop at `snapshot.now`.

    `reasons`, where given, is the last decision's reason for each pending workload: work waiting for a reason more
    capacity does not answer (`NOT_DEMAND`), or without a reason yet (not tried since it arrived), is no demand.
    `waiting_since`, where given, is when each pending workload last started waiting (a requeued one keeps its
    submit time, which orders the queue, but has waited only since it was stopped); by default its submit time.
    Every node in `nodes` must belong to one of `pools`."""
    now = snapshot.now
    by_pool = {p.name: p for p in pools}
    order = sorted(pools, key=lambda p: (p.price_micro, p.name))
    held = sorted(nodes, key=lambda n: n.name)
    for n in held:
        if n.pool not in by_pool:
            raise ValueError(f"burst node {n.name} is in unknown pool {n.pool!r}")
    busy = _busy_nodes(snapshot.workloads)

    def idle(n: BurstNode) -> bool:
        return n.ready_at is not None and n.idle_since is not None and n.name not in busy

    def idle_for(n: BurstNode) -> float:
        return now - n.idle_since if idle(n) and n.idle_since is not None else -math.inf

    releases = {n.name for n in held if idle_for(n) >= by_pool[n.pool].idle_release_s}
    kept = [n for n in held if n.name not in releases]
    drains = _drains(kept, by_pool, departments, hours_ahead)
    releases |= {n.name for n in kept if n.name in drains and idle(n)}
    kept = [n for n in kept if n.name not in releases]
    evictions = _evictions(snapshot.workloads, kept, departments)

    used = {p.name: 0 for p in pools}
    committed: dict[str, int] = {}
    rooms: dict[tuple[str, str], list[_Room]] = {}
    for n in sorted(kept, key=lambda n: (n.asked_at, n.name)):
        pool = by_pool[n.pool]
        used[pool.name] += pool.node_gpus
        committed[n.department] = committed.get(n.department, 0) + cost_micro(
            pool.node_gpus, pool.price_micro, hours_ahead
        )
        if n.name not in drains and (n.ready_at is None or idle(n)):
            rooms.setdefault((n.department, pool.name), []).append(_Room.fresh(pool))

    ask = _Asking(used, committed, rooms, hours_ahead)
    refused: set[tuple[str, str]] = set()
    for name, w in _demand(snapshot, departments, reasons, waiting_since or {}):
        dept = departments[name]
        fitting = [p for p in order if _holds(p, w)]
        if not fitting:
            continue
        if any(ask.place(name, dept, p, w, new=False) is None for p in fitting):
            continue
        why: list[str] = []
        for p in fitting:
            reason = ask.place(name, dept, p, w, new=True)
            if reason is None:
                break
            why.append(reason)
        else:
            refused.add((name, OVER_BUDGET if OVER_BUDGET in why else POOLS_FULL))

    requests = tuple(
        BurstRequest(pool, dept, count, tuple(ask.served[(dept, pool)]))
        for (dept, pool), count in sorted(ask.opened.items())
    )
    return BurstPlan(
        requests, tuple(sorted(releases)), tuple(sorted(refused)), tuple(sorted(drains - releases)), evictions
    )


# -- demand ------------------------------------------------------------------------------------------------------


def _demand(
    snapshot: Snapshot,
    departments: Mapping[str, DepartmentBurst],
    reasons: Mapping[str, PendingCode] | None,
    since: Mapping[str, float],
) -> list[tuple[str, Workload]]:
    """Pending work past its department's threshold that more capacity could start, with its department; oldest
    first, then by id."""
    tops = _tops(snapshot.queues)
    out = []
    for w in snapshot.workloads:
        if w.state is not State.PENDING or w.request.kind is GpuKind.NONE:
            continue
        name = tops.get(w.project) or ""
        dept = departments.get(name)
        if dept is None or dept.wait_threshold_s is None:
            continue
        if snapshot.now - since.get(w.id, w.submit_time) < dept.wait_threshold_s:
            continue
        if reasons is not None and (w.id not in reasons or reasons[w.id] in NOT_DEMAND):
            continue
        out.append((name, w))
    return sorted(out, key=lambda x: (x[1].submit_time, x[1].id))


def _busy_nodes(workloads: Sequence[Workload]) -> set[str]:
    return {p.node for w in workloads if w.state is not State.PENDING for p in w.placements}


def _holds(pool: BurstPool, w: Workload) -> bool:
    """Whether one of the pool's empty nodes holds a member of `w`, and `w` accepts the pool."""
    if w.pools and pool.name not in w.pools:
        return False
    if w.gpu_models and pool.gpu_model not in w.gpu_models:
        return False
    if w.clusters and pool.cluster not in w.clusters:
        return False
    return _Room.fresh(pool).fit(w)


def _drains(
    nodes: list[BurstNode], by_pool: Mapping[str, BurstPool], departments: Mapping[str, DepartmentBurst], hours: float
) -> set[str]:
    """The nodes that take no new work: oldest first, a node is kept while the department's spending plus its older
    nodes' cost for `hours` is still below its budget (or its pace), so each newer node drains an hour of spending
    earlier and the oldest once spending reaches the budget. A node's own hour is not counted: it was reserved at
    the ask, and counting it again would drain a node as soon as it was asked for, and ask again once it went back.
    A department without settings drains everything."""
    out: set[str] = set()
    before: dict[str, int] = {}
    for n in sorted(nodes, key=lambda n: (n.asked_at, n.name)):
        dept = departments.get(n.department)
        if dept is None:
            out.add(n.name)
            continue
        cap = dept.pace_micro
        if cap is None:
            continue
        pool = by_pool[n.pool]
        spent = before.get(n.department, dept.spent_micro)
        if spent >= cap:
            out.add(n.name)
        before[n.department] = spent + cost_micro(pool.node_gpus, pool.price_micro, hours)
    return out


def _evictions(
    workloads: Sequence[Workload], nodes: list[BurstNode], departments: Mapping[str, DepartmentBurst]
) -> tuple[str, ...]:
    """Running work on the nodes of departments whose spending has reached a budget they stop at, by id."""
    spent = set()
    for name, d in departments.items():
        if d.budget_micro is not None and d.stop_at_budget and d.spent_micro >= d.budget_micro:
            spent.add(name)
    stopping = {n.name for n in nodes if n.department in spent}
    if not stopping:
        return ()
    return tuple(
        sorted(w.id for w in workloads if w.state is State.RUNNING and any(p.node in stopping for p in w.placements))
    )


# -- asking ------------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Room:
    """What is left of one burst node, held or asked for in this plan: per device [free milli, free memory]."""

    devices: list[list[int]]
    device_memory_mib: int
    cpu: int
    memory: int
    new: bool = False
    """Asked for in this plan."""

    @classmethod
    def fresh(cls, pool: BurstPool, new: bool = False) -> _Room:
        devices = [[MILLI, pool.gpu_memory_mib] for _ in range(pool.node_gpus)]
        return cls(devices, pool.gpu_memory_mib, pool.cpu_milli, pool.memory_mib, new)

    def copy(self) -> _Room:
        return _Room([list(d) for d in self.devices], self.device_memory_mib, self.cpu, self.memory, self.new)

    def fit(self, w: Workload) -> bool:
        """Take one member of `w` here if it fits (lowest devices first); whether it did."""
        r = w.request
        if r.cpu_milli > self.cpu or r.memory_mib > self.memory:
            return False
        if r.kind is GpuKind.WHOLE:
            free = [d for d in self.devices if d[0] == MILLI]
            if len(free) < r.gpus:
                return False
            for d in free[: r.gpus]:
                d[0] = d[1] = 0
        else:  # a fraction or an amount of memory: one device, never one a whole-GPU member holds
            milli, memory = r.share_on(self.device_memory_mib)
            for d in self.devices:
                if milli <= d[0] and memory <= d[1]:
                    d[0] -= milli
                    d[1] -= memory
                    break
            else:
                return False
        self.cpu -= r.cpu_milli
        self.memory -= r.memory_mib
        return True


@dataclass(slots=True)
class _Asking:
    """The plan's working state: room left on each department's nodes per pool, GPUs held per pool, and each
    department's committed cost (its nodes for the look-ahead), growing as nodes are asked for."""

    used: dict[str, int]
    committed: dict[str, int]
    rooms: dict[tuple[str, str], list[_Room]]
    hours: float
    opened: dict[tuple[str, str], int] = field(default_factory=dict)
    served: dict[tuple[str, str], list[str]] = field(default_factory=dict)

    def place(self, name: str, dept: DepartmentBurst, pool: BurstPool, w: Workload, new: bool) -> str | None:
        """Place every member of `w` on the department's nodes in `pool`, asking for new ones where `new`; commit
        and return None if all fit, else change nothing and return why (OVER_BUDGET, POOLS_FULL, or "no-room")."""
        key = (name, pool.name)
        rooms = [r.copy() for r in self.rooms.get(key, [])]
        node_cost = cost_micro(pool.node_gpus, pool.price_micro, self.hours)
        opened, landed_new = 0, False
        for _ in range(w.gang_size):
            room = next((r for r in rooms if r.fit(w)), None)
            if room is None:
                if not new:
                    return "no-room"
                if self.used[pool.name] + (opened + 1) * pool.node_gpus > pool.max_gpus:
                    return POOLS_FULL
                cost = dept.spent_micro + self.committed.get(name, 0) + (opened + 1) * node_cost
                cap = dept.pace_micro
                if cap is not None and cost > cap:
                    return OVER_BUDGET
                room = _Room.fresh(pool, new=True)
                rooms.append(room)
                opened += 1
                room.fit(w)
            landed_new |= room.new
        self.rooms[key] = rooms
        self.used[pool.name] += opened * pool.node_gpus
        self.committed[name] = self.committed.get(name, 0) + opened * node_cost
        if landed_new:
            self.opened[key] = self.opened.get(key, 0) + opened
            self.served.setdefault(key, []).append(w.id)
        return None
