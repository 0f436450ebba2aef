"""Start-time estimates in the organisation simulation, and how good they were.

While work waits, the simulator asks the core's forecast (`core.forecast`) for every pending job's start, as the
live control plane would: at every tick where a job submitted since the last forecast is still waiting, and every
`REFRESH_TICKS` ticks besides. Two predictors of running work's ends are measured side by side:

* `declared`: every job ends at its declared maximum duration (`org_jobs.declare`: modal, round values, often
  the maximum allowed), and work that declares none (services) never ends;
* `history`: the runtime model (`core.runtime_model`) fed with the running time of every job that finished,
  capped by the declared maximum: what the product assumes.

Estimates only observe: they run on a copy of the snapshot with a memo of their own, so every other figure of
the run is the same with them or without them. A job's estimate is the first one made after its submission;
the refreshed one is the latest made by half its actual wait. Measured over the jobs that waited at least
`MIN_WAIT_S` before their first start: `eta_within_2x_pct`, the share whose actual wait was within a factor
of two of the estimated wait (an estimate without a time counts as a miss), and `eta_median_abs_error_s` over
those with a time.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpupool.core import SchedulerConfig, Snapshot
from gpupool.core.forecast import Forecast, Limits, runtimes_for
from gpupool.core.placement.memo import Memo
from gpupool.core.runtime_model import UNKNOWN, Basis, Runtime, RuntimeModel

PREDICTORS = ("history", "declared")
"""The first is the product's rule and gives the summary's headline figures."""
REFRESH_TICKS = 10
MIN_WAIT_S = 300.0

Made = list[tuple[float, float | None]]
"""(when, estimated start or None) for one job, in time order."""


def forecast_limits(interval: float) -> Limits:
    """The product's limits, stepping at least a tick apart (coarser steps, a quarter of the lookahead and two
    ticks, cut a day's forecast cycles by a quarter and doubled the median error)."""
    return Limits(min_step_s=interval)


@dataclass
class Estimator:
    config: SchedulerConfig
    limits: Limits
    model: RuntimeModel = field(default_factory=RuntimeModel)
    memo: Memo = field(default_factory=Memo)
    made: dict[str, dict[str, Made]] = field(default_factory=lambda: {p: {} for p in PREDICTORS})
    forecasts: int = 0
    cycles: int = 0
    """`schedule()` calls the forecasts made, for their cost."""

    def finished(self, project: str, kind: str, ran_s: float) -> None:
        self.model.observe(project, kind, ran_s)

    def estimate(self, snapshot: Snapshot, waiting: Iterable[str], declared: dict[str, float]) -> None:
        """Forecast every pending workload of `snapshot`; record it for the jobs in `waiting` (first waits)."""
        asked = set(waiting)
        for predictor in PREDICTORS:
            runtimes: dict[str, Runtime]
            if predictor == "history":
                runtimes = runtimes_for(snapshot, self.model, declared)
            else:
                runtimes = {
                    w.id: Runtime(declared[w.id], Basis.DECLARED) if w.id in declared else UNKNOWN
                    for w in snapshot.workloads
                }
            f = Forecast(snapshot, runtimes, self.config, self.limits, self.memo)
            for wid, e in f.run().items():
                if wid in asked:
                    self.made[predictor].setdefault(wid, []).append((snapshot.now, e.start))
            self.forecasts += 1
            self.cycles += f.cycles
        self.memo.bound()


@dataclass(frozen=True, slots=True)
class Outcome:
    """One job's actual first wait and its estimates, for the figures."""

    kind: str
    submit: float
    wait: float
    made: Made


def outcome_figures(outcomes: list[Outcome]) -> dict[str, Any]:
    """The accuracy figures of a set of jobs (those that waited at least `MIN_WAIT_S` and got an estimate)."""
    measured = [o for o in outcomes if o.wait >= MIN_WAIT_S and o.made]
    first = [_error(o, o.made[0][1]) for o in measured]
    refreshed = [_error(o, _latest(o.made, o.submit + o.wait / 2)) for o in measured]
    return {
        "eta_jobs": len(measured),
        "eta_without_time_pct": _pct(sum(1 for e in first if e is None), len(first)),
        "eta_within_2x_pct": _within(first),
        "eta_median_abs_error_s": _median(first),
        "eta_refreshed_within_2x_pct": _within(refreshed),
        "eta_refreshed_median_abs_error_s": _median(refreshed),
    }


def _latest(made: Made, by: float) -> float | None:
    at = made[0][1]
    for t, start in made:
        if t > by:
            break
        at = start
    return at


def _error(o: Outcome, start: float | None) -> tuple[float, float] | None:
    """(estimated wait, actual wait), or None without an estimated time."""
    return None if start is None else (max(0.0, start - o.submit), o.wait)


def _within(errors: list[tuple[float, float] | None]) -> float | None:
    if not errors:
        return None
    hits = sum(1 for e in errors if e is not None and e[1] / 2 <= e[0] <= 2 * e[1])
    return _pct(hits, len(errors))


def _median(errors: list[tuple[float, float] | None]) -> float | None:
    gaps = [abs(e[0] - e[1]) for e in errors if e is not None]
    return round(statistics.median(gaps), 1) if gaps else None


def _pct(part: float, whole: float) -> float:
    return round(100 * part / whole, 2) if whole else 0.0
