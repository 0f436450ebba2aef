"""Bursting under a budget: the organisation run under gpupool's rules once per department budget, and a table.

Budgets are monthly, per department; a run of `days` days gets each department `budget x days / 30` (a 30-day
month), so a table of monthly figures reads the same for any length of run. By default that budget accrues evenly
over the run, as a monthly one would over its month (`core.burst.accrued`): `t` seconds in, a department may have
committed `budget x t / (days x 86,400)`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from gpupool.core.burst import BurstPool
from gpupool.models.clusters import MICRO
from gpupool.sim.org import REGIMES, OrgSim
from gpupool.sim.org_burst import BURST_POOL, BurstSettings
from gpupool.sim.org_jobs import DAY, Organisation
from gpupool.sim.org_report import hourly, metrics

MONTH_DAYS = 30


@dataclass(frozen=True)
class BurstRun:
    """One run of the table: the organisation, its cluster, and one monthly budget (None: no cap)."""

    org: Organisation
    gpus: int
    days: float
    pool: BurstPool
    wait_threshold_s: float
    budget_usd_month: float | None
    estimates: bool = False
    paced: bool = True
    """The budget accrues evenly over the run (as a monthly one over its month); False: all of it from the start."""
    stop: bool = True
    """Stop a department's work on burst nodes once its budget is spent; False: let it finish."""

    @property
    def label(self) -> str:
        return "no cap" if self.budget_usd_month is None else f"${self.budget_usd_month:,.0f}"

    def settings(self) -> BurstSettings:
        budget = run_budget_micro(self.budget_usd_month, self.days)
        paced = self.days * DAY if self.paced else None
        return BurstSettings(self.pool, self.wait_threshold_s, budget, stop_at_budget=self.stop, paced_over_s=paced)


def run_budget_micro(usd_month: float | None, days: float) -> int | None:
    """A monthly budget in dollars pro-rated to a run of `days` days, in micro-dollars (rounded down)."""
    if usd_month is None:
        return None
    return int(Fraction(usd_month) * MICRO * Fraction(days) / MONTH_DAYS)


def burst_pool(max_gpus: int, price_usd: float, delay_s: float, idle_s: float, gpu_model: str) -> BurstPool:
    return BurstPool(
        BURST_POOL, round(price_usd * MICRO), delay_s, max_gpus, idle_release_s=idle_s, gpu_model=gpu_model
    )


def simulate(run: BurstRun, progress: Callable[[float], None] | None = None) -> OrgSim:
    regime = dataclasses.replace(REGIMES["gpupool"], estimates=run.estimates)
    sim = OrgSim(run.org, regime, run.gpus, run.days * DAY, burst=run.settings())
    sim.run(progress=progress)
    return sim


def run_one(run: BurstRun) -> tuple[dict[str, Any], tuple[list[float], list[float], list[float]]]:
    """The run's figures (`metrics`, with `burst`) and its hourly on-premises utilisation, for the plot."""
    sim = simulate(run)
    return metrics(sim), hourly(sim)


def run_all(
    runs: Sequence[BurstRun], workers: int, on_done: Callable[[BurstRun], None] | None = None
) -> list[tuple[dict[str, Any], tuple[list[float], list[float], list[float]]]]:
    """Every run, `workers` at a time, in the order given."""
    if workers <= 1:
        out = []
        for run in runs:
            out.append(run_one(run))
            if on_done:
                on_done(run)
        return out
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run_one, run): k for k, run in enumerate(runs)}
        results: dict[int, tuple[dict[str, Any], tuple[list[float], list[float], list[float]]]] = {}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            if on_done:
                on_done(runs[futures[future]])
    return [results[k] for k in range(len(runs))]


def row(run: BurstRun, m: dict[str, Any]) -> dict[str, Any]:
    """What the table shows of one run (and the command's JSON line)."""
    b = m["burst"]
    return {
        "budget_usd_month": run.budget_usd_month,
        "budget_usd_run": b["budget_usd_per_department"],
        "burst_cost_usd": b["cost_usd"],
        "burst_cost_usd_by_department": b["cost_usd_by_department"],
        "burst_gpu_hours": b["gpu_hours"],
        "burst_nodes_asked": b["nodes_asked"],
        "wait_p95_s": m["wait_p95_s"],
        "training_wait_p95_s": m["per_class"].get("training", {}).get("wait_p95_s"),
        "mean_jct_s": m["mean_jct_s"],
        "on_prem_allocation_pct": m["gpu_allocation_pct"],
        "preemptions_per_100_jobs": m["preemptions_per_100_jobs"],
    }


def table(rows: Sequence[dict[str, Any]], days: float) -> str:
    lines = [
        f"| budget per department, month (run of {days:g} days) | burst cost, all departments | burst GPU-hours "
        "| p95 wait | p95 wait, training | mean JCT | on-prem GPUs allocated |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        month = "no cap" if r["budget_usd_month"] is None else f"${r['budget_usd_month']:,.0f}"
        run = "" if r["budget_usd_run"] is None else f" (${r['budget_usd_run']:,.2f})"
        training = r["training_wait_p95_s"]
        lines.append(
            f"| {month}{run} | ${r['burst_cost_usd']:,.2f} | {r['burst_gpu_hours']:,.1f} | {_h(r['wait_p95_s'])} | "
            f"{_h(training) if training is not None else '—'} | {_h(r['mean_jct_s'] or 0.0)} | "
            f"{r['on_prem_allocation_pct']:.1f}% |"
        )
    return "\n".join(lines) + "\n"


def _h(seconds: float) -> str:
    return f"{seconds:,.0f} s ({seconds / 3600:.1f} h)"
