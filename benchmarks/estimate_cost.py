"""What start-time estimates add to the scheduler's cycle: the core's forecast from a steady snapshot, timed step
by step, then spread over cycles exactly as the live loop spreads it (`gpupool.control.estimates`: `budget_s` of
credit a cycle, carried up to the dearest step's cost, so a step dearer than a cycle's budget is taken every few
cycles), and as the live loop runs it where the platform forks: whole, in a forked child
(`gpupool.control.forecast_process`), the loop paying the fork and the read-back.
Used by `scheduler_scale.py` (the steady cycle with estimates on) and `forecast_cost.py`.

Runtimes come from a runtime model fed with seeded lognormal runtimes per project and class (median 1 h), and a
third of the workloads declare a maximum (4, 8, 24 or 72 h), as a live control plane's history would give."""

from __future__ import annotations

import contextlib
import gc
import math
import os
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpupool.control.estimates import BUDGET_S
from gpupool.control.forecast_process import ForecastProcess
from gpupool.core import SchedulerConfig, Snapshot
from gpupool.core.forecast import Forecast, Limits, runtimes_for
from gpupool.core.placement.memo import Memo
from gpupool.core.runtime_model import RuntimeModel

HISTORY_PER_KEY = 32
MEDIAN_RUNTIME_S = 3600.0
DECLARED_SHARE = 1 / 3
CLASSES = ("production", "training", "interactive", "batch")


def history(projects: Sequence[str], rng: random.Random) -> RuntimeModel:
    model = RuntimeModel()
    for project in projects:
        for cls in CLASSES:
            for _ in range(HISTORY_PER_KEY):
                model.observe(project, cls, rng.lognormvariate(math.log(MEDIAN_RUNTIME_S), 1.0))
    return model


def spread(begin_s: float, steps: Sequence[float], budget_s: float) -> list[float]:
    """The estimate's time in each cycle until the forecast is done, under the live loop's credit rule."""
    credit = dearest = 0.0
    taken = 0
    cycles: list[float] = []
    while taken < len(steps):
        spent = begin_s if not cycles else 0.0
        credit = min(credit + budget_s, max(budget_s, dearest))
        while taken < len(steps) and credit - spent >= dearest:
            spent += steps[taken]
            dearest = max(dearest, steps[taken])
            taken += 1
        credit -= spent
        cycles.append(spent)
    return cycles


def measure_forked(
    snapshot: Snapshot,
    model: RuntimeModel,
    declared: Mapping[str, float],
    config: SchedulerConfig,
    limits: Limits,
    cycle: Callable[[], object] | None = None,
) -> dict[str, Any]:
    """The live default: the cycle that starts a forecast pays the fork, the cycle that finds it done pays reading
    it back; the forecast itself runs in the child. Pages the parent writes while the child lives are copied
    then (copy on write): `cycle`, timed twice right after the fork, shows what that costs the next cycles."""
    t0 = time.perf_counter()
    child = ForecastProcess(snapshot, model, declared, config, limits, timeout_s=3600.0)
    fork_s = time.perf_counter() - t0
    started = time.monotonic()
    if hasattr(os, "sched_setaffinity"):  # the child runs beside the pinned parent, on the other cores
        others = set(range(os.cpu_count() or 1)) - os.sched_getaffinity(0)
        with contextlib.suppress(OSError):
            os.sched_setaffinity(child.pid, others or os.sched_getaffinity(0))
    after: list[float] = []
    for _ in range(2 if cycle is not None else 0):
        assert cycle is not None
        gc.collect()
        t0 = time.perf_counter()
        cycle()
        after.append(time.perf_counter() - t0)
    polls: list[float] = []
    while True:
        t0 = time.perf_counter()
        done = child.poll()
        polls.append(time.perf_counter() - t0)
        if done:
            break
        time.sleep(0.05)  # the loop's next cycle
    out: dict[str, Any] = {
        "fork_s": round(fork_s, 4),
        "collect_s": round(max(polls), 4),
        "wall_s": round(time.monotonic() - started, 2),
        "failed": child.failed,
        "per_cycle_max_s": round(max(fork_s, max(polls)), 4),
    }
    if after:
        out["cycles_after_fork_s"] = [round(x, 4) for x in after]
    return out


def measure(
    snapshot: Snapshot,
    config: SchedulerConfig,
    projects: Sequence[str],
    rng: random.Random,
    *,
    limits: Limits | None = None,
    budget_s: float = BUDGET_S,
    log: Any = None,
    stepped: bool = True,
    cycle: Callable[[], object] | None = None,
) -> dict[str, Any]:
    """The forked forecast's cost, and with `stepped` the stepped one's (as long again)."""
    model = history(projects, rng)
    declared = {w.id: rng.choice((4, 8, 24, 72)) * 3600.0 for w in snapshot.workloads if rng.random() < DECLARED_SHARE}
    forked = measure_forked(snapshot, model, declared, config, limits or Limits(), cycle)
    if log is not None:
        log(f"forked: {forked}")
    if not stepped:
        return {"forked": forked}
    t0 = time.perf_counter()
    forecast = Forecast(snapshot, runtimes_for(snapshot, model, declared), config, limits or Limits(), Memo())
    begin_s = time.perf_counter() - t0
    steps: list[float] = []
    more = True
    while more:
        t0 = time.perf_counter()
        more = forecast.step()
        steps.append(time.perf_counter() - t0)
        if log is not None:
            log(f"forecast step {len(steps)}: {steps[-1]:.3f}s, ahead {forecast.at - snapshot.now:.0f}s")
    cycles = spread(begin_s, steps, budget_s)
    estimates = forecast.estimates()
    return {
        "forked": forked,
        "begin_s": round(begin_s, 4),
        "steps": forecast.steps,
        "step_p50_s": round(statistics.median(steps), 4),
        "step_max_s": round(max(steps), 4),
        "total_s": round(begin_s + sum(steps), 3),
        "budget_s": budget_s,
        "cycles_to_finish": len(cycles),
        "per_cycle_mean_s": round(statistics.fmean(cycles), 4),
        "per_cycle_max_s": round(max(cycles), 4),
        "estimates": len(estimates),
        "estimates_with_time": sum(1 for e in estimates.values() if e.start is not None),
    }
