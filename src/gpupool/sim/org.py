"""An organisation over time: a discrete-event simulation on a simulated clock, the core deciding.

Events are arrivals, completions, notebook users coming and going, and a scheduling tick every `interval`
seconds. At a tick where anything changed, or where a project waits for GPUs it is owed (else every fifth
tick while work waits), the simulator builds a snapshot and applies what `schedule()` decides (`sim.apply`):
binds start work, evictions stop it at once (the grace period is not simulated) and requeue it, having lost
the progress since its last checkpoint. With a burst pool (`org_burst`), the core's `burst.plan` also runs at
those ticks and at every tick while burst nodes are held, and the nodes it asks for join the cluster.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from gpupool.core import (
    MILLI,
    Device,
    Node,
    PendingCode,
    Placement,
    Queue,
    Quota,
    Request,
    SchedulerConfig,
    Snapshot,
    State,
    Workload,
    schedule,
)
from gpupool.core.burst_pools import pool_of
from gpupool.core.placement.memo import Memo
from gpupool.core.priority import BATCH, INTERACTIVE, PRODUCTION, TRAINING, PriorityClass
from gpupool.sim.apply import apply
from gpupool.sim.org_burst import BurstCloud, BurstSettings
from gpupool.sim.org_eta import REFRESH_TICKS, Estimator, forecast_limits
from gpupool.sim.org_jobs import Organisation, OrgJob
from gpupool.sim.pools import SHARED, shared_pools

CHECKPOINT_S = 1_800.0
"""Training and batch work checkpoints every 30 minutes; an eviction loses what came after."""
GPU_MEMORY_MIB = 80 * 1024
GPU_MODEL = "H100"


@dataclass(frozen=True)
class Regime:
    name: str
    shared: bool
    """One pool everybody borrows from; otherwise each project owns a fixed set of GPUs."""
    fractions: bool
    """Keep fractional requests; otherwise round them up to a whole GPU."""
    classes: bool
    """Priority classes by workload type; otherwise everything is preemptible training but services."""
    idle_timeout_s: float | None
    """Suspend a notebook whose user has been away this long."""
    actions: tuple[str, ...]
    estimates: bool = False
    """Forecast every waiting job's start and measure the forecasts (`org_eta`); they change nothing else."""


REGIMES = {
    "manual": Regime(
        "manual", shared=False, fractions=False, classes=False, idle_timeout_s=None, actions=("allocate",)
    ),
    "quota": Regime(
        "quota",
        shared=True,
        fractions=False,
        classes=False,
        idle_timeout_s=None,
        actions=("stale_gangs", "allocate", "reclaim"),
    ),
    "gpupool": Regime(
        "gpupool",
        shared=True,
        fractions=True,
        classes=True,
        idle_timeout_s=1_800.0,
        actions=("stale_gangs", "allocate", "reclaim", "preempt"),
        estimates=True,
    ),
}
CLASS_OF = {"training": TRAINING, "batch": BATCH, "notebook": INTERACTIVE, "inference": PRODUCTION}


@dataclass
class Record:
    """What happened to one job."""

    job: OrgJob
    first_start: float | None = None
    finish: float | None = None
    preemptions: int = 0
    suspensions: int = 0
    owed_wait: float = 0.0
    """Longest stretch it waited while its project was below deserved with room for it (see `_owed`)."""
    owed_since: float | None = None
    remaining: float = 0.0
    pending_since: float | None = None
    started: float | None = None
    placements: tuple[Placement, ...] = ()
    token: int = 0
    suspended: bool = False
    nominated: tuple[str, ...] = ()
    """Nodes evictions were made for while it waits, as the control plane remembers them."""
    ran_s: float = 0.0
    """Running time so far, over every start."""


@dataclass
class Totals:
    allocated_milli_s: float = 0.0
    busy_milli_s: float = 0.0
    waiting_s: float = 0.0
    allocated_while_waiting_milli_s: float = 0.0
    by_kind: dict[str, list[float]] = field(default_factory=dict)
    """Per workload type: [allocated, busy] milli-GPU-seconds."""
    timeline: list[tuple[float, int, int]] = field(default_factory=list)
    """(time, allocated milli, busy milli) at each step, for the plot."""
    burst_allocated_milli_s: float = 0.0
    """On burst nodes, which the figures above leave out: they are of the on-premises GPUs only."""
    burst_busy_milli_s: float = 0.0


class OrgSim:
    def __init__(
        self,
        org: Organisation,
        regime: Regime,
        gpus: int,
        horizon: float,
        interval: float = 60.0,
        burst: BurstSettings | None = None,
    ) -> None:
        self.org, self.regime, self.gpus, self.horizon, self.interval = org, regime, gpus, horizon, interval
        self.nodes, self.queues = _cluster(org, regime, gpus)
        self.pools = shared_pools(self.nodes)
        self.cloud = BurstCloud(burst, tuple(sorted(org.departments))) if burst is not None else None
        """Burst nodes rented from a cloud (`org_burst`); None: the on-premises cluster only."""
        if self.cloud is not None:
            self.pools.update({pool_of(d): SHARED for d in org.departments})
        self.reasons: dict[str, PendingCode] = {}
        """The last decision's reason for each workload it left pending."""
        self.decided: Snapshot | None = None
        """The snapshot after the last decision of the current tick, for the burst plan."""
        self.config = SchedulerConfig(actions=regime.actions)
        self.memo = Memo()
        self.records = {j.id: Record(j, remaining=j.work) for j in org.jobs}
        self.pending: dict[str, Record] = {}
        self.running: dict[str, Record] = {}
        self.events: list[tuple[float, int, str, str, int]] = []
        self.seq = 0
        self.now = 0.0
        self.totals = Totals()
        self.dirty = False
        self.owing = False
        """Some project below its deserved quota has work waiting that fits in it."""
        self.estimator = Estimator(self.config, forecast_limits(interval)) if regime.estimates else None
        self.unestimated: set[str] = set()
        """Jobs submitted since the last forecast."""
        for j in org.jobs:
            self._push(j.submit, "arrive", j.id)
            if j.kind == "notebook":
                self._push(j.submit + j.work, "leave", j.id)
            for b in j.bursts:
                self._push(b.start, "active", j.id)

    # -- the loop ----------------------------------------------------------------------------------

    def run(self, progress: Callable[[float], None] | None = None) -> None:
        tick = 0
        while self.now < self.horizon:
            next_tick = (tick + 1) * self.interval
            while self.events and self.events[0][0] <= next_tick:
                t, _, kind, jid, token = heapq.heappop(self.events)
                self._advance(min(t, self.horizon))
                self._handle(kind, jid, token)
            self._advance(min(next_tick, self.horizon))
            tick += 1
            self._idle_check()
            # Like the live loop, which runs every 2 s: every tick while a project waits for GPUs it is owed.
            self.decided = None
            if self.dirty or self.owing or (self.pending and tick % 5 == 0):
                self._schedule()
            if self.cloud is not None and (self.decided is not None or self.cloud.held):
                self._burst(self.cloud)
            if self.estimator is not None:
                self._estimate(self.estimator, tick)
            if progress is not None and tick % 60 == 0:
                progress(self.now)

    def _handle(self, kind: str, jid: str, token: int) -> None:
        if kind == "burst-ready":
            if self.cloud is not None:
                self.cloud.ready(jid, self.now)
                self.dirty = True
            return
        rec = self.records[jid]
        if kind == "arrive":
            rec.pending_since = self.now
            self.pending[jid] = rec
            self.unestimated.add(jid)
            self.dirty = True
        elif kind == "finish" and token == rec.token and jid in self.running:
            self._stop(rec)
            self._finished(rec)
        elif kind == "leave" and rec.finish is None:  # a notebook session ends, running or not
            if jid in self.running:
                self._stop(rec)
            self.pending.pop(jid, None)
            self._finished(rec)
        elif kind == "active" and rec.suspended and rec.finish is None:  # the user is back: resume
            rec.suspended = False
            rec.pending_since = self.now
            self.pending[jid] = rec
            self.dirty = True

    def _snapshot(self) -> Snapshot:
        workloads = [self._workload(r) for r in (*self.running.values(), *self.pending.values())]
        if self.cloud is not None:
            nodes, queues = self.nodes + self.cloud.nodes(), self.cloud.queues(self.queues)
            return Snapshot(nodes, queues, tuple(workloads), self.now, self.pools)
        return Snapshot(self.nodes, self.queues, tuple(workloads), self.now, self.pools)

    def _schedule(self) -> None:
        for _ in range(3):  # evictions release at once, so their preemptors can start in the same tick
            snapshot = self._snapshot()
            decision = schedule(snapshot, self.config, memo=self.memo)
            applied = apply(snapshot, decision)
            self.reasons = {p.workload: p.code for p in decision.pending}
            self.decided = applied.snapshot
            for w in applied.evicted:
                self._evict(self.records[w.id])
            for w in applied.started:
                self._start(self.pending.pop(w.id), w.placements)
            for w in applied.snapshot.workloads:
                if w.id in self.pending:  # where evictions were made for it, as the control plane remembers
                    self.pending[w.id].nominated = w.nominated_nodes
            self.dirty = False
            if not applied.evicted:
                break

    def _burst(self, cloud: BurstCloud) -> None:
        """The burst plan on the snapshot the core just decided on (or a fresh one), carried out: at every tick
        where the core decided or a burst node is held, so a spent budget is seen within a tick."""
        since = {jid: rec.pending_since for jid, rec in self.pending.items() if rec.pending_since is not None}
        ready, stops = cloud.step(self.decided or self._snapshot(), self.reasons, since)
        for t, name in ready:
            self._push(t, "burst-ready", name)
        if stops:  # a department's budget is spent: its work on burst nodes stops, as if preempted
            for wid in stops:
                self._evict(self.records[wid])
            self.dirty = True
            since.update((wid, self.now) for wid in stops)
            ready, _ = cloud.step(self._snapshot(), self.reasons, since)  # its nodes, empty now, go back at once
            for t, name in ready:
                self._push(t, "burst-ready", name)

    def _estimate(self, estimator: Estimator, tick: int) -> None:
        """At a tick where a job submitted since the last forecast still waits, and every few ticks while any
        job waits for its first start: the forecast, recorded for the jobs that have not started yet."""
        waiting = [jid for jid, rec in self.pending.items() if rec.first_start is None]
        fresh = any(jid in self.pending for jid in self.unestimated)
        self.unestimated.clear()
        if not waiting or not (fresh or tick % REFRESH_TICKS == 0):
            return
        declared = {
            jid: rec.job.declared
            for jid, rec in (*self.running.items(), *self.pending.items())
            if rec.job.declared is not None
        }
        estimator.estimate(self._snapshot(), waiting, declared)

    # -- state changes -----------------------------------------------------------------------------

    def _start(self, rec: Record, placements: tuple[Placement, ...]) -> None:
        rec.placements, rec.started, rec.owed_since, rec.nominated = placements, self.now, None, ()
        if self.cloud is not None:
            self.cloud.started(placements)
        if rec.first_start is None:
            rec.first_start = self.now
        rec.token += 1
        self.running[rec.job.id] = rec
        if rec.job.kind != "notebook":
            self._push(self.now + max(0.0, rec.remaining), "finish", rec.job.id, rec.token)

    def _evict(self, rec: Record) -> None:
        """Stop running work and requeue it; training and batch work keeps what it did up to its last checkpoint."""
        done = self.now - (rec.started or self.now)
        self._stop(rec)
        rec.preemptions += 1
        if rec.job.kind in ("training", "batch"):
            rec.remaining -= done // CHECKPOINT_S * CHECKPOINT_S
        rec.pending_since = self.now
        self.pending[rec.job.id] = rec

    def _stop(self, rec: Record) -> None:
        if self.running.pop(rec.job.id, None) is not None:
            rec.ran_s += self.now - (rec.started or self.now)
            if self.cloud is not None:
                self.cloud.stopped(rec.placements, self.now)
        rec.token += 1
        rec.placements, rec.nominated = (), ()

    def _finished(self, rec: Record) -> None:
        rec.finish = self.now
        self.dirty = True
        if self.estimator is not None and rec.ran_s > 0:
            self.estimator.finished(rec.job.project, self._class(rec.job).name, rec.ran_s)

    def _idle_check(self) -> None:
        timeout = self.regime.idle_timeout_s
        if timeout is None:
            return
        for rec in list(self.running.values()):
            if rec.job.kind != "notebook":
                continue
            last = max((b.end for b in rec.job.bursts if b.end <= self.now), default=rec.job.submit)
            active = any(b.start <= self.now < b.end for b in rec.job.bursts)
            if not active and self.now - max(last, rec.started or 0.0) >= timeout:
                self._stop(rec)
                rec.suspended = True
                rec.suspensions += 1
                self.dirty = True

    def _advance(self, t: float) -> None:
        dt = t - self.now
        if dt <= 0:
            return
        allocated = busy = 0
        for rec in self.running.values():
            milli = sum(d.milli for p in rec.placements for d in p.devices)
            working = round(milli * _busy_share(rec.job, self.now, t))
            if self.cloud is not None:  # what runs on burst nodes is counted apart
                rented = sum(d.milli for p in rec.placements if self.cloud.is_burst(p.node) for d in p.devices)
                if rented:
                    share = working / milli if milli else 0.0
                    self.totals.burst_allocated_milli_s += rented * dt
                    self.totals.burst_busy_milli_s += rented * share * dt
                    milli, working = milli - rented, round((milli - rented) * share)
            allocated += milli
            busy += working
            kind = self.totals.by_kind.setdefault(rec.job.kind, [0.0, 0.0])
            kind[0] += milli * dt
            kind[1] += working * dt
        self.totals.allocated_milli_s += allocated * dt
        self.totals.busy_milli_s += busy * dt
        if self.pending:
            self.totals.waiting_s += dt
            self.totals.allocated_while_waiting_milli_s += allocated * dt
        self._owed(dt)
        self.totals.timeline.append((self.now, allocated, busy))
        self.now = t

    def _owed(self, dt: float) -> None:
        """Charge waiting time to the jobs a project below its deserved quota is owed GPUs for: its waiting
        jobs in queue order (priority, then age) as long as they fit in what it is owed."""
        self.owing = False
        if not self.regime.shared:
            return
        room: dict[str, int] = {p: g * MILLI for p, g in self.org.deserved_gpus.items()}
        for rec in self.running.values():
            room[rec.job.project] -= self._milli(rec.job)
        queued = sorted(self.pending.values(), key=lambda r: (-CLASS_OF[r.job.kind].value, r.job.submit, r.job.id))
        for rec in queued:
            p, need = rec.job.project, self._milli(rec.job)
            if need <= room[p]:
                room[p] -= need
                self.owing = True
                if rec.owed_since is None:
                    rec.owed_since = self.now
                rec.owed_wait = max(rec.owed_wait, self.now + dt - rec.owed_since)
            else:
                rec.owed_since = None

    # -- translation -------------------------------------------------------------------------------

    def _milli(self, job: OrgJob) -> int:
        if job.gpu_milli and not self.regime.fractions:
            return MILLI * job.members
        return job.milli

    def _workload(self, rec: Record) -> Workload:
        job, regime = rec.job, self.regime
        if job.gpu_milli and regime.fractions:
            request = Request(gpu_milli=job.gpu_milli)
        else:
            request = Request(gpus=job.gpus or 1)
        cls = self._class(job)
        running = job.id in self.running
        checkpoint = None
        if running and rec.started is not None and job.kind in ("training", "batch"):
            # What an eviction would lose starts at its last checkpoint, and the core weighs victims by it.
            checkpoint = rec.started + (self.now - rec.started) // CHECKPOINT_S * CHECKPOINT_S
        return Workload(
            job.id,
            job.project,
            request,
            priority=cls.value,
            priority_class=cls.name,
            preemptible=cls.preemptible or not regime.shared,
            min_runtime_s=cls.min_runtime_s,
            gang_size=job.members,
            pools=() if regime.shared else (job.project,),
            submit_time=job.submit,
            state=State.RUNNING if running else State.PENDING,
            placements=rec.placements if running else (),
            start_time=rec.started if running else None,
            nominated_nodes=() if running else rec.nominated,
            checkpoint_time=checkpoint,
        )

    def _class(self, job: OrgJob) -> PriorityClass:
        if self.regime.classes:
            return CLASS_OF[job.kind]
        return PRODUCTION if job.kind == "inference" else TRAINING

    def _push(self, t: float, kind: str, jid: str, token: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, jid, token))


def _busy_share(job: OrgJob, start: float, end: float) -> float:
    if job.kind != "notebook":
        return job.busy_fraction
    active = sum(max(0.0, min(b.end, end) - max(b.start, start)) for b in job.bursts)
    return active / (end - start)


def _cluster(org: Organisation, regime: Regime, gpus: int) -> tuple[tuple[Node, ...], tuple[Queue, ...]]:
    """Nodes of 8 GPUs in one shared pool, or carved into a pool per project sized by its quota."""

    def node(name: str, pool: str, count: int) -> Node:
        return Node(name, pool, 128_000, 1024 * 1024, tuple(Device(i, GPU_MODEL, GPU_MEMORY_MIB) for i in range(count)))

    queues: list[Queue] = []
    if regime.shared:
        nodes = tuple(node(f"gpu-{i:03d}", "shared", 8) for i in range(gpus // 8))
        for dept, projects in sorted(org.departments.items()):
            deserved = sum(org.deserved_gpus[p] for p in projects)
            queues.append(Queue(dept, quotas={"shared": Quota(deserved * MILLI)}))
            queues.extend(Queue(p, dept, {"shared": Quota(org.deserved_gpus[p] * MILLI)}) for p in projects)
        return nodes, tuple(queues)
    out: list[Node] = []
    for dept, projects in sorted(org.departments.items()):
        queues.append(Queue(dept))
        for p in projects:
            queues.append(Queue(p, dept))
            owned = org.deserved_gpus[p]
            for k in range(0, owned, 8):
                out.append(node(f"{p}-{k // 8}", p, min(8, owned - k)))
    return tuple(out), tuple(queues)
