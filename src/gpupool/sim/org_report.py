"""Figures of an organisation run: utilisation, waiting, completion, preemption; per class and project."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from gpupool.core import MILLI
from gpupool.sim.org import OrgSim, Record
from gpupool.sim.org_eta import PREDICTORS, Estimator, Outcome, outcome_figures

BATCHLIKE = ("training", "batch")


def metrics(sim: OrgSim) -> dict[str, Any]:
    records = list(sim.records.values())
    t = sim.totals
    capacity = sim.gpus * MILLI
    out: dict[str, Any] = {
        "gpu_allocation_pct_while_waiting": _pct(t.allocated_while_waiting_milli_s, t.waiting_s * capacity),
        "gpu_allocation_pct": _pct(t.allocated_milli_s, sim.horizon * capacity),
        "busy_share_of_allocated_pct": _pct(t.busy_milli_s, t.allocated_milli_s),
        "busy_gpu_pct": _pct(t.busy_milli_s, sim.horizon * capacity),
        "busy_by_class": {
            k: {
                "gpu_allocation_pct": _pct(a, sim.horizon * capacity),
                "busy_gpu_pct": _pct(b, sim.horizon * capacity),
                "busy_share_of_allocated_pct": _pct(b, a),
            }
            for k, (a, b) in sorted(t.by_kind.items())
        },
        "time_with_work_waiting_pct": _pct(t.waiting_s, sim.horizon),
        **_waits_and_jct(records, sim.horizon),
        "preemptions_per_100_jobs": round(100 * sum(r.preemptions for r in records) / max(1, len(records)), 2),
        "notebook_suspensions": sum(r.suspensions for r in records),
        "jobs": len(records),
        "owed_waits_over_one_interval": sum(1 for r in records if r.owed_wait > sim.interval + 1e-6),
        "per_class": {
            k: _waits_and_jct([r for r in records if r.job.kind == k], sim.horizon)
            for k in sorted({r.job.kind for r in records})
        },
        "per_project": {
            p: {
                "deserved_gpus": sim.org.deserved_gpus[p],
                **_waits_and_jct([r for r in records if r.job.project == p], sim.horizon),
            }
            for p in sorted(sim.org.deserved_gpus)
        },
    }
    if sim.estimator is not None:
        _add_estimates(out, sim.estimator, records)
    if sim.cloud is not None:
        out["burst"] = {
            **sim.cloud.figures(sim.horizon),
            "gpu_allocation_pct_of_on_prem": _pct(t.burst_allocated_milli_s, sim.horizon * capacity),
            "busy_share_of_allocated_pct": _pct(t.burst_busy_milli_s, t.burst_allocated_milli_s),
        }
    return out


def _add_estimates(out: dict[str, Any], estimator: Estimator, records: list[Record]) -> None:
    """The product's predictor (history capped by the declared maximum) overall and per class, beside the
    summary's other figures; every predictor's figures under `eta_by_predictor`; the forecasts' cost."""
    by: dict[str, Any] = {}
    for predictor in PREDICTORS:
        made = estimator.made[predictor]
        outcomes = [
            Outcome(r.job.kind, r.job.submit, r.first_start - r.job.submit, made[r.job.id])
            for r in records
            if r.first_start is not None and r.job.id in made
        ]
        by[predictor] = {
            **outcome_figures(outcomes),
            "per_class": {
                k: outcome_figures([o for o in outcomes if o.kind == k]) for k in sorted({o.kind for o in outcomes})
            },
        }
    headline = by[PREDICTORS[0]]
    out.update({k: v for k, v in headline.items() if k != "per_class"})
    for kind, figures in headline["per_class"].items():
        out["per_class"][kind].update(figures)
    out["eta_by_predictor"] = by
    out["eta_forecasts"] = estimator.forecasts
    out["eta_forecast_cycles"] = estimator.cycles


def _waits_and_jct(records: list[Record], horizon: float) -> dict[str, Any]:
    """Waits and completion times; work still waiting or running at the end counts until the end (a lower
    bound), so a regime is not flattered by the jobs it never started."""
    waits = sorted((r.first_start if r.first_start is not None else horizon) - r.job.submit for r in records)
    jcts = [(r.finish if r.finish is not None else horizon) - r.job.submit for r in records if r.job.kind in BATCHLIKE]
    return {
        "jobs": len(records),
        "started": sum(1 for r in records if r.first_start is not None),
        "wait_p50_s": round(_quantile(waits, 0.5), 1),
        "wait_p95_s": round(_quantile(waits, 0.95), 1),
        "mean_jct_s": round(statistics.fmean(jcts), 1) if jcts else None,
        "completed": sum(1 for r in records if r.finish is not None and r.job.kind in BATCHLIKE),
        "preemptions": sum(r.preemptions for r in records),
    }


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    k = min(len(values) - 1, max(0, round(q * (len(values) - 1))))
    return values[k]


def _pct(part: float, whole: float) -> float:
    return round(100 * part / whole, 2) if whole else 0.0


Hourly = tuple[list[float], list[float], list[float]]
"""Hours, and allocated and busy percent of the on-premises GPUs in each."""


def plot(sims: dict[str, OrgSim], path: Path) -> None:
    plot_hourly({name: hourly(sim) for name, sim in sims.items()}, path)


def plot_hourly(series: dict[str, Hourly], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(series), 1, figsize=(12, 2.6 * len(series)), sharex=True, squeeze=False)
    for ax, (name, (hours, allocated, busy)) in zip(axes[:, 0], series.items(), strict=True):
        ax.fill_between(hours, allocated, step="post", alpha=0.35, label="allocated")
        ax.plot(hours, busy, drawstyle="steps-post", linewidth=0.8, label="busy")
        ax.set(ylabel="% of GPUs", ylim=(0, 105), title=name)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    axes[-1, 0].set_xlabel("hours")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def hourly(sim: OrgSim) -> Hourly:
    capacity = sim.gpus * MILLI
    buckets: dict[int, list[float]] = {}
    timeline = sim.totals.timeline
    for (t, a, b), nxt in zip(timeline, [*timeline[1:], (sim.horizon, 0, 0)], strict=True):
        dt = nxt[0] - t
        acc = buckets.setdefault(int(t // 3600), [0.0, 0.0, 0.0])
        acc[0] += a * dt
        acc[1] += b * dt
        acc[2] += dt
    hours = sorted(buckets)
    return (
        [float(h) for h in hours],
        [100 * buckets[h][0] / (buckets[h][2] * capacity) for h in hours],
        [100 * buckets[h][1] / (buckets[h][2] * capacity) for h in hours],
    )
