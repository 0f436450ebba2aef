"""The scheduler loop: runs a cycle on every event (submit, cancel, process exit) and at least every interval."""

from __future__ import annotations

import contextvars
import gc
import itertools
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace
from typing import Any

from prometheus_client import Histogram
from sqlalchemy import inspect, select, true
from sqlalchemy.orm import Session, sessionmaker

from gpupool.backends.base import Backend, LaunchSpec, Sample
from gpupool.control import mlflow_runs
from gpupool.control.apply import act, persist, sequential
from gpupool.control.burst import Bursting
from gpupool.control.causes import eviction_causes
from gpupool.control.clusters import Clusters, FleetView, fleet_of
from gpupool.control.estimates import Estimates
from gpupool.control.foreign import GANG_TIMEOUT_S, Adoption
from gpupool.control.loop import SchedulerLoop
from gpupool.control.outcomes import log_outcome
from gpupool.control.policies import Policy, chains, effective, enforce
from gpupool.control.reconcile import reconcile
from gpupool.control.usage import account
from gpupool.control.view import WorkloadView
from gpupool.control.volumes import volume_specs
from gpupool.control.workdirs import collect_workdirs
from gpupool.core import Decision, SchedulerConfig, schedule
from gpupool.core.cycle import Observer
from gpupool.core.placement.memo import Memo
from gpupool.failpoints import failpoint
from gpupool.lifecycle import transitions as lifecycle
from gpupool.lifecycle.phases import ACTIVE, AllocPhase
from gpupool.logs import cycle_context
from gpupool.store import changes, workload_tokens
from gpupool.store.holdings import live_devices, still_held
from gpupool.store.secrets import project_environment as secret_environment
from gpupool.store.snapshot import build_snapshot
from gpupool.store.tables import EventRow, NodeRow, QueueRow, UserRow, WorkloadRow

try:  # traces are optional: without the API package there are none, and without an SDK its tracer is a no-op
    from opentelemetry import trace as otel_trace
except ImportError:  # pragma: no cover - depends on what is installed
    otel_trace = None  # type: ignore[assignment]

log = logging.getLogger("gpupool.control")

SWITCH_INTERVAL_S = 0.0001
STALE_VIEW_S = 30.0
"""A cycle that follows none for this long (or five intervals, if longer) reads every workload again."""
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""The core's steps take well under a millisecond on a small cluster; a commit on a busy store, seconds."""
WORKDIR_RETENTION_S = 7 * 86400.0
"""How long a finished workload's working directory is kept unless the server's settings say otherwise."""
COLLECT_EVERY_S = 60.0


class Controller:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        backend: Backend,
        *,
        interval_s: float = 2.0,
        config: SchedulerConfig | None = None,
        clock: Callable[[], float] = time.time,
        max_gap_s: float = 0.5,
        telemetry_interval_s: float = 5.0,
        inventory_interval_s: float | None = None,
        fence: Callable[[Session], None] | None = None,
        workdir_retention_s: float = WORKDIR_RETENTION_S,
        gang_timeout_s: float = GANG_TIMEOUT_S,
        cluster_down_after_s: float = 30.0,
        bursting: Bursting | None = None,
        after_cycle: Sequence[Callable[[float], None]] = (),
        api_url: str | None = None,
        mlflow: str = "mlflow",
    ) -> None:
        self.api_url, self.mlflow = api_url, mlflow
        """Where a workload's processes call the API (GPUPOOL_URL, with its own GPUPOOL_TOKEN); None: not told."""
        self._token_key: bytes | None = None
        self.gang_timeout_s = gang_timeout_s
        self.sessions = sessions
        self.workdir_retention_s = workdir_retention_s
        """How long a finished workload's working directory is kept (the backend's, where it keeps one)."""
        self._next_collect = 0.0
        self.backend = backend
        self.interval_s = interval_s
        self.config = config or SchedulerConfig()
        self.clock = clock
        self.max_gap_s = max_gap_s
        self.lock = threading.RLock()
        """Held by a cycle, so that two never interleave. No request waits for it: a cancel or a resume writes its
        row at once, and a cycle's commit leaves rows written since it read them to the next cycle."""
        self.view = WorkloadView()
        """The workloads as the last cycle left them; each cycle reads only what was written since."""
        self._session: Session | None = None
        """The cycles' session: it keeps the live rows between cycles (one cycle at a time uses it)."""
        self.telemetry_interval_s = telemetry_interval_s
        self.inventory_interval_s = inventory_interval_s
        """How often nodes are listed again (kubernetes); None: only at start (this host)."""
        self._last_inventory = 0.0
        self._last_pass = time.monotonic()
        self.last_sample: Sample | None = None
        self.last_sample_s = 0.0
        self._last_sample_at: float | None = None
        self.last_decision: Decision | None = None
        self.last_cycle_s = 0.0
        self.cycles = 0
        self.step_seconds = Histogram(
            "gpupool_scheduler_step_seconds",
            "Duration of one step of a scheduling cycle: the control plane's (reconcile, ..., commit_events) and, "
            "within schedule, the core's (open, allocate, ..., explain).",
            ["step"],
            registry=None,  # one per controller; /metrics collects it from here
            buckets=STEP_BUCKETS,
        )
        self._cycle_ids = itertools.count(1)
        self._failing: str | None = None
        self._memo = Memo()
        self.estimates = Estimates(sessions, self.config)
        self.clusters = Clusters(cluster_down_after_s)
        """The hub's spokes: their heartbeats, and the workloads of one that is down (where the backend is a fleet)."""
        self.bursting = bursting
        self.after_cycle = list(after_cycle)
        """Called with the cycle's time after each cycle this server leads (the sweeps' driver); each paces itself,
        and one that fails is logged, not the cycle's failure."""
        """Burst nodes rented for departments whose work waited too long (None: this hub never bursts)."""
        self.adoption = Adoption(gang_timeout_s=self.gang_timeout_s)
        """Pods gpupool did not make that name it as their scheduler (kubernetes), and their workloads."""
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="gpupool-launch")
        self.fence = fence
        """Called with the cycle's session before each of its commits; raises to stop a deposed leader acting."""
        self.loop = SchedulerLoop(
            self.cycle, lambda: self.last_cycle_s - self.last_sample_s, interval_s=interval_s, max_gap_s=max_gap_s
        )  # a telemetry sample is rare; it earns the API no rest

    def register_nodes(self) -> None:
        """Write the backend's nodes to the store; nodes that are gone stay, unschedulable, for what they held."""
        self._last_inventory = time.monotonic()
        with self.sessions() as s:
            nodes = self.backend.inventory()
            names = {n.name for n in nodes}
            held = live_devices(s)
            for gone in s.scalars(select(NodeRow).where(NodeRow.name.not_in(names) if names else true())):
                gone.schedulable = False
            for node in nodes:
                row = s.get(NodeRow, node.name) or NodeRow(name=node.name)
                row.backend = self.backend.capabilities().name
                row.pool, row.cpu_milli, row.memory_mib = node.pool, node.cpu_milli, node.memory_mib
                row.schedulable, row.updated_at, row.cluster = node.schedulable, self.clock(), node.cluster
                offered = [{"index": d.index, "model": d.model, "memory_mib": d.memory_mib} for d in node.devices]
                row.devices = still_held(node.name, offered, row.devices or [], held)
                s.merge(row)
            s.commit()

    def wake(self) -> None:
        self.loop.wake()

    def start(self) -> None:
        # A cycle computes for up to a second at 100,000 queued, holding the interpreter; a request thread waits for
        # it each time it wakes from the store, and SQLite's driver lets go of the interpreter for every row it
        # steps: a page of 100 waited ~100 times. At 1 ms a page's p99 was 120-150 ms while cycles ran; at 0.1 ms,
        # 58-66 ms, with cycles no slower (they give way only while a request is waiting).
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        self.loop.start()

    def stop(self) -> None:
        self.loop.stop()
        self.estimates.close()
        self.read_again()

    def read_again(self) -> None:
        """Drop what the cycles keep between them, so the next one reads every workload from the store (a new
        leader: what it kept from an earlier term may be what another leader has since changed)."""
        with self.lock:
            if self._session is not None:
                self._session.close()
                self._session = None
            self.view.reset()
            # Another leader may have adopted and ended pods meanwhile.
            self.adoption = Adoption(gang_timeout_s=self.gang_timeout_s)

    def _commit(self, s: Session) -> None:
        if self.fence is not None:
            self.fence(s)
        s.commit()

    def _launch_all(self, launch: Callable[[LaunchSpec], None], specs: list[LaunchSpec]) -> list[BaseException | None]:
        if len(specs) <= 1:
            return sequential(launch, specs)

        def one(spec: LaunchSpec) -> BaseException | None:
            try:
                launch(spec)
            except Exception as e:  # reported per launch
                return e
            return None

        # A pool thread does not inherit this one's context: each launch runs in a copy, so what it logs carries
        # the cycle's id (and its trace, where there is one).
        contexts = [contextvars.copy_context() for _ in specs]
        return list(self._pool.map(lambda ctx, spec: ctx.run(one, spec), contexts, specs))

    def _sample(
        self, s: Session, rows: list[WorkloadRow], policies: dict[int, Policy], nodes: dict[str, NodeRow], now: float
    ) -> None:
        last = self._last_sample_at
        if last is not None and now - last < self.telemetry_interval_s:
            return
        started = time.perf_counter()
        sample = self.backend.sample()
        # A long gap (the server was down) is not charged to anyone: usage starts again from now.
        since = last if last is not None and now - last <= 3 * self.telemetry_interval_s else now
        prices = None if self.bursting is None else self.bursting.view.prices
        account(s, rows, sample, policies, nodes, since, now, burst_prices=prices)
        self._last_sample_at = now
        self.last_sample = sample
        self.last_sample_s = time.perf_counter() - started
        self.step_seconds.labels("telemetry").observe(self.last_sample_s)

    @contextmanager
    def _step(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.step_seconds.labels(name).observe(time.perf_counter() - started)

    def _core_observer(self) -> Observer:
        """Times the core's steps: it reports each step's start and end and never reads a clock itself."""
        starts: dict[str, float] = {}

        def note(step: str, phase: str) -> None:
            if phase == "start":
                starts[step] = time.perf_counter()
            elif step in starts:
                self.step_seconds.labels(step).observe(time.perf_counter() - starts.pop(step))

        return note

    def cycle(self) -> bool:
        """One pass: reconcile → snapshot → schedule → persist → act. Returns whether work is in flight.
        Every line logged meanwhile carries the cycle's id; a failure is logged here, with it, and raised."""
        cycle_id = next(self._cycle_ids)
        with cycle_context(cycle_id), _span(cycle_id):
            try:
                busy = self._cycle()
            except Exception as e:
                # A failure gets its traceback; the same failure again (a store that stays down) one line at
                # debug: the loop logs the outage and its end once.
                failure = f"{type(e).__name__}: {e}"[:300]
                if failure != self._failing:
                    log.exception("scheduling cycle failed")
                else:
                    log.debug("scheduling cycle failed again: %s", failure)
                self._failing = failure
                raise
            self._failing = None
            return busy

    def _cycle(self) -> bool:
        due: Callable[[], bool] | None = getattr(self.backend, "inventory_due", None)
        if (
            self.inventory_interval_s is not None
            and time.monotonic() - self._last_inventory >= self.inventory_interval_s
        ) or (due is not None and due()):
            with self._step("inventory"):
                self.register_nodes()
        with self.lock:
            if time.monotonic() - self._last_pass > max(STALE_VIEW_S, 5 * self.interval_s):
                # No cycle for long (this server did not lead, or the store was down): another leader may have
                # written what this view keeps without a stamp (queued reasons). Read everything again.
                self.view.reset()
            if self._session is None:
                self._session = self.sessions()
            try:
                with _collector_paused():
                    return self._pass(self._session)
            except BaseException:
                # What the view keeps may not be what was committed: read everything again next time.
                self._session.close()
                self._session = None
                self.view.reset()
                raise

    def _pass(self, s: Session) -> bool:
        started = time.perf_counter()
        self.last_sample_s = 0.0
        now = self.clock()
        # Nothing is written until the decision is made: the write lock (SQLite has one) is held only for
        # the commit, not while the scheduler thinks, so submits are never kept waiting by a cycle.
        with s.no_autoflush:
            with self._step("reconcile"):
                self._release_retries(now)
                self.adoption.admit(self.sessions, self.backend, now, self._commit)
                observed = self.backend.observe()
                queues = list(s.scalars(select(QueueRow)))
                projects = {q.id: q.name for q in queues}
                self.view.refresh(s, projects)
                loaded = self.view.rows()
                fleet = fleet_of(self.backend)
                moved = [] if fleet is None else self.clusters.step(s, fleet, loaded, observed, now)
                unreachable = (lambda _: False) if fleet is None else fleet.unreachable
                reconciled, ended = reconcile(loaded, observed, now, unreachable)
                reconciled = moved + reconciled
                if self.bursting is not None:
                    reconciled += self.bursting.stops(loaded, now)
                s.add_all(reconciled)
            rows = [r for r in loaded if r.state in ACTIVE and not r.hold]
            nodes = {n.name: n for n in s.scalars(select(NodeRow))}
            policies = {qid: effective(chain) for qid, chain in chains(queues).items()}
            self._sample(s, rows, policies, nodes, now)
            with self._step("policies"):
                enforced = enforce(rows, policies, now)
                s.add_all(enforced)
            with self._step("snapshot"):
                snapshot = build_snapshot(s, self.view.workloads(rows), now)
                if self.bursting is not None:
                    snapshot = self.bursting.shape(s, snapshot)
            with self._step("schedule"):
                decision = schedule(snapshot, self.config, observe=self._core_observer(), memo=self._memo)
            with self._step("persist"):
                by_id = {r.id: r for r in loaded}
                self.view.bound(s, decision, by_id)
                persisted = persist(by_id, decision, now, eviction_causes(s, decision, snapshot))
                self.estimates.placed(persisted, by_id, now)
                s.add_all(persisted)
                notes = self.view.waiting(decision, by_id)
        with self._step("commit"):
            # Persist first: a crash from here on relaunches by allocation id, never twice.
            lost = self._commit_checked(s, by_id.values(), notes)
        failpoint("cycle.after-persist")
        log_outcome([e for e in [*reconciled, *enforced, *persisted] if e.workload_id not in lost], by_id, projects)
        for alloc_id in ended:  # a member's end is written even where its workload's row was not
            self.backend.forget(alloc_id)
        cached: dict[int, dict[str, str]] = {}

        def project_secrets(project_id: int) -> dict[str, str]:
            if project_id not in cached:
                cached[project_id] = secret_environment(s, project_id)
            return cached[project_id]

        levels = {q.id: q.pod_security for q in queues}
        hosted = {q.id for q in queues if q.host_network}
        acting = [r for wid, r in sorted(by_id.items()) if wid not in lost]
        mounts = volume_specs(s, acting, projects)

        def launcher(launch: Callable[[LaunchSpec], None], specs: list[LaunchSpec]) -> list[BaseException | None]:
            return self._launch_all(
                launch,
                [replace(x, volumes=mounts.get(x.workload_id, ()), host_network=x.project_id in hosted) for x in specs],
            )

        with self._step("act"):
            own = self._own(s, projects)
            events, busy = act(
                acting, projects, nodes, self.backend, now, launcher, project_secrets, levels, own, self.mlflow
            )
            s.add_all(events)
        failpoint("cycle.before-events")
        with self._step("commit_events"):
            self._commit_checked(s, acting, [])
        self.adoption.explain(self.view, self.backend, self.sessions)
        if self.bursting is not None and self.bursting.due(now):
            began = time.perf_counter()
            if self.bursting.step(s, snapshot, decision, by_id, _reached(fleet), self._commit, now):
                self.step_seconds.labels("burst").observe(time.perf_counter() - began)  # only where it bursts
        if now >= self._next_collect:
            self._next_collect = now + COLLECT_EVERY_S
            collect_workdirs(s, self.backend, now - self.workdir_retention_s)
        with self._step("estimates"):
            self.estimates.after_cycle(snapshot, decision, by_id.values(), projects)
        for hook in self.after_cycle:
            try:
                hook(now)
            except Exception:
                log.exception("after the cycle: %s", getattr(hook, "__qualname__", hook))
        # Kept for its shares (metrics, portal) without its 100,000 reasons: kept, they outlived the cycle, and the
        # collector's first pass after it walked them all, holding the interpreter for 40-80 ms of every request.
        self.last_decision = replace(decision, pending=())
        self.last_cycle_s = time.perf_counter() - started
        self.cycles += 1
        self._last_pass = time.monotonic()
        return busy or bool(decision.evictions)

    def _own(self, s: Session, projects: Mapping[int, str]) -> Callable[[WorkloadRow], dict[str, str]]:
        """Each launch's own: its token to call the API as its workload (revoked when its attempt ends), and its
        MLflow run where it is tracked (gpupool.control.mlflow_runs)."""
        if self._token_key is None and self.api_url is not None:
            with self.sessions() as own:  # its own session: making the key commits
                self._token_key = workload_tokens.key(own)
        signing, url = self._token_key, self.api_url

        def env(row: WorkloadRow) -> dict[str, str]:
            out: dict[str, str] = {}
            if url is not None and signing is not None:
                token = workload_tokens.mint(signing, row.id, row.attempt)
                out |= {"GPUPOOL_URL": url, "GPUPOOL_TOKEN": token, "GPUPOOL_PROJECT": projects[row.project_id]}
            if row.mlflow:
                owner = s.get(UserRow, row.owner_id)
                try:
                    out |= mlflow_runs.environment(row, projects[row.project_id], owner.name if owner else "?")
                except Exception as e:  # the work runs untracked rather than not at all
                    log.warning("workload %d: no MLflow run (%s)", row.id, " ".join(str(e).split())[:200])
                    out["MLFLOW_TRACKING_URI"] = str(row.mlflow["uri"])
            return out

        return env

    def _release_retries(self, now: float) -> None:
        """Workloads whose retry's backoff is over join the queue, before this cycle reads what changed (one
        indexed read when none is due). A row someone wrote since it was read here (a cancel) is left to them."""
        with self.sessions() as s, s.no_autoflush:
            due = list(s.scalars(select(WorkloadRow).where(WorkloadRow.retry_at <= now).order_by(WorkloadRow.id)))
            if not due:
                return
            read = {r.id: r.version for r in due}
            for row in due:
                lifecycle.release(row, now)
            if changes.claim(s, read) != set(read):
                s.rollback()  # decided again next cycle, from what was written
                return
            self._commit(s)

    def _commit_checked(self, s: Session, rows: Iterable[WorkloadRow], notes: list[dict[str, Any]]) -> set[int]:
        """Commits what this cycle wrote, except to workload rows someone else wrote since the cycle read them (a
        cancel, say): those keep the other writer's values, lose this cycle's events for them, and are read
        again next cycle. Changes to their members (ended, launched) are kept: they record what happened.
        Returns the rows left out."""
        mine = list(rows)
        with s.no_autoflush:
            written = {r.id: r for r in s.dirty if isinstance(r, WorkloadRow) and s.is_modified(r)}
            lost = set(written) - changes.claim(s, {wid: r.version for wid, r in written.items()})
            for wid in sorted(lost):
                _unwrite(s, written[wid])
            changes.note_waiting(s, notes)
        self._commit(s)
        self.view.settle(r for r in mine if r.id not in lost)
        self.view.forget(lost)
        if lost:
            log.info("workloads %s changed while the cycle decided; deciding again next cycle", sorted(lost))
        return lost


def _reached(fleet: FleetView | None) -> Callable[[str], bool]:
    """Whether a cluster answered its last heartbeat (a hub without spokes reaches none)."""
    if fleet is None:
        return lambda _: False
    health = fleet.spoke_health()
    return lambda name: (h := health.get(name)) is not None and h.reached


@contextmanager
def _collector_paused() -> Iterator[None]:
    """A cycle makes and drops a few hundred thousand objects at 100,000 queued (the core's working state, the
    decision); reference counting frees them, and the cyclic collector, walking them several times a cycle,
    took a fifth of it. It runs again once the cycle is over."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def _unwrite(s: Session, row: WorkloadRow) -> None:
    """Drops this session's changes to a workload row and what follows from them: its new members, its new events,
    its members' stop times and readiness. What its members did (launched, ended) stays: it happened."""
    for alloc in list(row.allocations):
        if alloc in s.new:
            row.allocations.remove(alloc)
            continue
        attrs = inspect(alloc).attrs
        if attrs.stop_at.history.deleted:
            alloc.stop_at = attrs.stop_at.history.deleted[0]
        if alloc.state == AllocPhase.READY and attrs.state.history.added:
            alloc.state = AllocPhase.LAUNCHED.value  # ready only with its workload's start, which is not written
    for obj in list(s.new):
        if isinstance(obj, EventRow) and obj.workload_id == row.id:
            s.expunge(obj)
    s.refresh(row, [c.key for c in WorkloadRow.__mapper__.column_attrs])


def _span(cycle_id: int) -> AbstractContextManager[object]:
    if otel_trace is None:
        return nullcontext()
    tracer = otel_trace.get_tracer("gpupool.control")
    return tracer.start_as_current_span("gpupool.cycle", attributes={"gpupool.cycle_id": cycle_id})
