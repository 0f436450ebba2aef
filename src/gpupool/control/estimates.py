"""Start-time estimates for queued work, kept by the scheduler loop: the core's forecast (gpupool.core.forecast)
run forward from a cycle's own snapshot, a few steps after each cycle, and written to the queued rows when done.

Cost. After every cycle the loop hands `after_cycle` its snapshot. Where the platform can fork (`forked`, the
default), a new forecast runs whole in a forked child (`forecast_process`): the cycle pays the fork (10-20 ms at
30,000 workloads) and, when the child is done, reading its result back; the forecast's own seconds run on
another core, off the interpreter the requests share, so no cap on the queue is needed. A child past `timeout_s`
is killed and counts in `failures`. A child that took T seconds is followed by T seconds without one, so
forecasts use at most half a core (at 1,000 nodes with 10,000 waiting a forecast takes about two minutes of a
core: benchmarks/scheduler_scale.py). Without fork, the forecast in progress takes steps in the loop while the
time it has been granted lasts: `budget_s` (100 ms) more per cycle, kept up to the cost of the dearest step
seen, so a step that costs more than a cycle's budget is taken once every few cycles and the loop spends on
average about `budget_s` a cycle on estimates; a step costs about a cycle of the core (0.6 s at 100,000
pending), so the cycle that takes one is that much longer, and above `max_pending` (20,000) queued no forecast
is made that way. A forecast takes at most `Limits.max_steps` (64) steps. A new forecast starts when the last
is done and the queue changed (work submitted, bound, evicted or gone) or `refresh_s` (60 s) has passed. Its
results are written only where a row's estimate moved (by more than a minute or a tenth of the wait), a few
thousand rows at least and more while the cycle's budget lasts, without stamping the rows' versions (as a
waiting reason is written, gpupool.store.changes): nobody needs to read the rows again for it.

Runtimes. A `RuntimeModel` fed with every finished workload's runtime by project and priority class (the key the
core's `runtimes_for` reads) when the loop first runs, then with each workload that ends; a declared
`max_duration_s` caps it (the workload is stopped there). Deterministic: the estimates depend only on the
snapshot, the runtimes observed (in order of their end) and the declared durations."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import bindparam, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from gpupool.control.forecast_process import FORKED, ForecastProcess
from gpupool.core import Decision, SchedulerConfig
from gpupool.core.forecast import Forecast, Limits, runtimes_for
from gpupool.core.model import Snapshot, State
from gpupool.core.placement.memo import Memo
from gpupool.core.runtime_model import RuntimeModel
from gpupool.lifecycle.events import EventCode
from gpupool.lifecycle.phases import ACTIVE, QUEUED, TERMINAL
from gpupool.store.changes import WORKLOADS
from gpupool.store.snapshot import core_id, row_id
from gpupool.store.tables import EventRow, QueueRow, WorkloadRow

log = logging.getLogger("gpupool.control")

BUDGET_S = 0.1
"""Seconds of the loop's time per cycle, on average, for estimates (0: none are made)."""
MAX_PENDING = 20_000
"""No forecast is made while more than this many workloads wait (see the module's cost)."""
REFRESH_S = 60.0
"""A forecast is made again at least this often (loop time) while work waits, even if the queue did not change."""
WRITE_CHUNK = 500
"""Rows per write statement and transaction (about 10 ms on SQLite)."""
MOVE_S = 60.0
MOVE_SHARE = 0.1
"""An estimate is written again only when it moved by more than this or this share of the wait it forecasts:
a refresh at 100,000 pending rewrites what moved, not every row whose time shifted by a step."""
TIMEOUT_S = 600.0
"""A forecast in a child that has not finished by then is killed (it is bounded by its steps; this is a guard)."""
HISTORY = 50_000
"""Finished workloads read at start (the newest): far more than the model keeps per key."""

_WRITE = (
    update(WORKLOADS)
    # States one by one: an IN list expands per statement, which a statement run for many rows cannot.
    .where(WORKLOADS.c.id == bindparam("wid"), or_(*(WORKLOADS.c.state == state for state in sorted(QUEUED))))
    .values(eta=bindparam("at"), eta_basis=bindparam("basis"))
)


class Estimates:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        config: SchedulerConfig,
        *,
        budget_s: float = BUDGET_S,
        refresh_s: float = REFRESH_S,
        max_pending: int = MAX_PENDING,
        limits: Limits | None = None,
        timer: Callable[[], float] = time.perf_counter,
        forked: bool = FORKED,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        self.sessions, self.config, self.limits = sessions, config, limits
        self.forked, self.timeout_s = forked, timeout_s
        """Forecasts run in a forked child (`forecast_process`); False: stepped here within the budget."""
        self.failures = 0
        """Forecasts whose child failed or ran out of time (none written; the next is made as usual)."""
        self.budget_s, self.refresh_s, self.timer = budget_s, refresh_s, timer
        self.max_pending = max_pending
        self.model = RuntimeModel()
        self.forecasts = 0
        """Forecasts completed (and written)."""
        self.last_cost_s = 0.0
        """Seconds the last cycle spent on estimates (stepping and writing)."""
        self._history_read = False
        self._forecast: Forecast | ForecastProcess | None = None
        self._published = False
        self._begun = 0.0
        self._signature: tuple[int, ...] = ()
        self._credit = 0.0
        self._rest_until = 0.0
        self._dearest = 0.0
        self._memo = Memo()
        self._written: dict[int, tuple[float | None, str]] = {}
        """What the rows hold, as this loop wrote them."""
        self._unwritten: list[dict[str, Any]] = []

    @property
    def forecast(self) -> Forecast | ForecastProcess | None:
        """The forecast in progress, or the last one made (None while no work waits)."""
        return self._forecast

    def placed(self, events: Iterable[EventRow], rows: Mapping[int, WorkloadRow], now: float) -> None:
        """Records in each start (placed) event of this cycle the estimate its workload had, beside the wait it
        had (both from when it was queued: a requeued workload keeps its first place and time)."""
        for ev in events:
            row = rows.get(ev.workload_id)
            if ev.code != EventCode.PLACED or row is None:
                continue
            had = self._written.pop(row.id, None)
            eta, basis = had if had is not None else (row.eta, row.eta_basis)
            ev.args = {
                **ev.args,
                "eta": eta,
                "eta_basis": basis,
                "estimated_wait_s": None if eta is None else round(eta - row.queued_at, 3),
                "waited_s": round(now - row.queued_at, 3),
            }
            row.eta = row.eta_basis = None

    def after_cycle(
        self, snapshot: Snapshot, decision: Decision, rows: Iterable[WorkloadRow], projects: Mapping[int, str]
    ) -> None:
        """Feeds the model what ended this cycle, then advances (or starts) the forecast within its budget."""
        if self.budget_s <= 0:  # switched off
            return
        start = self.timer()
        if not self._history_read:
            self._read_history(projects)
        else:
            for row in rows:
                if row.state in TERMINAL and row.finished_at == snapshot.now and row.started_at is not None:
                    self.model.observe(
                        projects.get(row.project_id, ""), row.priority_class, row.finished_at - row.started_at
                    )
        if len(decision.pending) > self.max_pending and not self.forked:
            self._forecast = None
            self._flush(start)
            self.last_cost_s = self.timer() - start
            return
        signature = (len(snapshot.workloads), len(decision.pending), len(decision.binds), len(decision.evictions))
        forecast = self._forecast
        if forecast is None or (
            forecast.done
            and (signature != self._signature or snapshot.now - self._begun >= self.refresh_s)
            and time.monotonic() >= self._rest_until
        ):
            if not decision.pending:
                self._forecast = None
                self.last_cost_s = self.timer() - start
                return
            declared = self._declared(snapshot)
            if self.forked:
                limits = self.limits or Limits()
                forecast = ForecastProcess(
                    snapshot, self.model, declared, self.config, limits, timeout_s=self.timeout_s
                )
            else:
                self._memo.bound()
                runtimes = runtimes_for(snapshot, self.model, declared)
                forecast = Forecast(snapshot, runtimes, self.config, self.limits, self._memo)
            self._forecast = forecast
            self._begun, self._signature, self._published = snapshot.now, signature, False
        if isinstance(forecast, ForecastProcess):
            self._collect(forecast)
        else:
            self._advance(forecast, start)
        self._flush(start)
        self.last_cost_s = self.timer() - start

    def _advance(self, forecast: Forecast, start: float) -> None:
        # Credit builds up to the dearest step's cost, so a step dearer than one cycle's budget is still taken
        # every few cycles, and the average stays within the budget.
        self._credit = min(self._credit + self.budget_s, max(self.budget_s, self._dearest))
        spent = self.timer() - start
        while not forecast.done and self._credit - spent >= self._dearest:
            before = self.timer()
            forecast.step()
            cost = self.timer() - before
            self._dearest = max(self._dearest, cost)
            spent += cost
        self._credit -= spent
        if forecast.done and not self._published:
            self._published = True
            self._publish(forecast)

    def _collect(self, forecast: ForecastProcess) -> None:
        if forecast.poll() and not self._published:
            self._published = True
            # A child busy for T seconds is followed by T at rest: forecasts take at most half a core.
            self._rest_until = time.monotonic() + forecast.wall_s
            if forecast.failed:
                self.failures += 1
                log.warning("a start-time forecast failed or ran past %.0f s; none written", self.timeout_s)
            else:
                self._publish(forecast)

    def close(self) -> None:
        """Stops a forecast still running in a child (the loop is stopping)."""
        if isinstance(self._forecast, ForecastProcess):
            self._forecast.close()

    def _publish(self, forecast: Forecast | ForecastProcess) -> None:
        """Queues the writes of the estimates that moved (`_moved`) since written; `_flush` makes them."""
        self.forecasts += 1
        self._unwritten = []
        for label, est in forecast.estimates().items():
            wid = row_id(label)
            if _moved(self._written.get(wid), est.start, est.basis.value, forecast.now):
                self._unwritten.append({"wid": wid, "at": est.start, "basis": est.basis.value})
        self._unwritten.reverse()  # taken from the end: the first in queue order are written first

    def _flush(self, start: float) -> None:
        """Writes queued estimates, a chunk at least and more while the cycle's budget lasts: 100,000 rows (all
        moved) take a few cycles rather than a second of one."""
        if not self._unwritten:
            return
        with self.sessions() as s:
            first = True
            while self._unwritten and (first or self.timer() - start < self.budget_s):
                first = False
                chunk = self._unwritten[-WRITE_CHUNK:]
                s.execute(_WRITE, chunk)
                # A commit per chunk: the store's write lock is held for one chunk, not the cycle's whole
                # budget, so a cancel or submit waits behind at most that (cancel p99 190 ms at 100,000 rows).
                s.commit()
                del self._unwritten[-WRITE_CHUNK:]
                self._written.update((w["wid"], (w["at"], w["basis"])) for w in chunk)

    def _declared(self, snapshot: Snapshot) -> dict[str, float]:
        """The declared maximum durations of the snapshot's workloads, by core id (read only where one is set)."""
        ids = {w.id for w in snapshot.workloads if w.state is not State.RELEASING}
        with self.sessions() as s:
            query = select(WorkloadRow.id, WorkloadRow.max_duration_s).where(
                WorkloadRow.max_duration_s.is_not(None), WorkloadRow.state.in_(sorted(ACTIVE))
            )
            declared = {core_id(wid): seconds for wid, seconds in s.execute(query) if seconds is not None}
        return {k: v for k, v in declared.items() if k in ids}

    def _read_history(self, projects: Mapping[int, str]) -> None:
        self._history_read = True
        with self.sessions() as s:
            names = projects or {q.id: q.name for q in s.scalars(select(QueueRow))}
            query = (
                select(
                    WorkloadRow.project_id, WorkloadRow.priority_class, WorkloadRow.started_at, WorkloadRow.finished_at
                )
                .where(WorkloadRow.state.in_(sorted(TERMINAL)), WorkloadRow.started_at.is_not(None))
                .where(WorkloadRow.finished_at.is_not(None))
                .order_by(WorkloadRow.finished_at.desc(), WorkloadRow.id.desc())
                .limit(HISTORY)
            )
            ended: Sequence[Any] = list(s.execute(query))
        for project_id, klass, started, finished in reversed(ended):  # observed in the order they ended
            self.model.observe(names.get(project_id, ""), klass, finished - started)


def _moved(written: tuple[float | None, str] | None, start: float | None, basis: str, now: float) -> bool:
    if written is None or written[1] != basis or (written[0] is None) != (start is None):
        return True
    if written[0] is None or start is None:
        return False
    return abs(start - written[0]) > max(MOVE_S, MOVE_SHARE * (written[0] - now))
