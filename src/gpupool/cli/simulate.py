"""`gpupool simulate`: replay public cluster traces through the scheduling core."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn


class _Lines:
    """Progress as plain lines, for a log or a pipe, where rich's bar shows nothing until the end: a line each
    tenth of a task, so a run of many minutes says it is alive."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.tasks: dict[int, tuple[str, float, float]] = {}  # description, total, completed
        self.start = time.monotonic()

    def __enter__(self) -> _Lines:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def add_task(self, description: str, total: float) -> TaskID:
        self.tasks[len(self.tasks)] = (description, total, 0.0)
        return TaskID(len(self.tasks) - 1)

    def advance(self, task: TaskID, advance: float = 1) -> None:
        self.update(task, completed=self.tasks[task][2] + advance)

    def update(self, task: TaskID, completed: float) -> None:
        description, total, before = self.tasks[task]
        self.tasks[task] = (description, total, completed)
        if total > 0 and (completed >= total > before or int(10 * completed / total) > int(10 * before / total)):
            elapsed = int(time.monotonic() - self.start)
            self.console.print(f"{description.strip()}: {completed:g}/{total:g} ({100 * completed / total:.0f}%), "
                               f"{elapsed // 60}m{elapsed % 60:02d}s", highlight=False)  # fmt: skip


def _progress() -> Progress | _Lines:
    if not err.is_terminal:
        return _Lines(err)
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err
    )


app = typer.Typer(
    help="Replay public GPU-cluster traces through gpupool's scheduler.", no_args_is_help=True, add_completion=False
)
err = Console(stderr=True)

if TYPE_CHECKING:
    from gpupool.sim.org_burst_report import BurstRun


@app.command()
def packing(
    nodes: Annotated[Path, typer.Option("--nodes", help="Node list CSV (sn,cpu_milli,memory_mib,gpu,model).")],
    pods: Annotated[Path, typer.Option("--pods", help="Pod list CSV (11-column or 5-column layout).")],
    policy: Annotated[str, typer.Option("--policy", help="A placement policy, or 'all'.")],
    out: Annotated[Path, typer.Option("--out", help="Directory for summary.json, CSVs and plots.")],
    seeds: Annotated[str, typer.Option("--seeds", help="Seeds: 42-51, or 42,45.")] = "42-51",
    tune: Annotated[float, typer.Option("--tune", help="Inflate GPU requests to this multiple of capacity.")] = 1.3,
    jobs: Annotated[int, typer.Option("--jobs", help="Parallel processes (default: all cores).")] = 0,
) -> None:
    """The FGD (ATC'23) packing experiment: fill the cluster pod by pod, measure unallocated GPUs."""
    import json

    from gpupool.sim import packing_report as report
    from gpupool.sim.traces import TraceError, load_nodes, load_pods

    try:
        seed_list = report.parse_seeds(seeds)
        load_nodes(nodes)
        load_pods(pods)
    except (ValueError, TraceError) as e:
        err.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from None
    known = report.known_policies()
    policies = list(known) if policy == "all" else [policy]
    if any(p not in known for p in policies):
        err.print(f"[red]error:[/] unknown policy {policy!r}; known: {', '.join(known)}, all")
        raise typer.Exit(2)
    if not 1.0 <= tune <= 3.0:
        err.print("[red]error:[/] --tune must be between 1.0 and 3.0")
        raise typer.Exit(2)
    work = [report.Job(nodes, pods, p, s, tune) for p in policies for s in seed_list]
    workers = jobs if jobs > 0 else (os.cpu_count() or 1)
    with _progress() as bar:
        task = bar.add_task(f"packing {report.trace_name(pods)}", total=len(work))
        results = report.run_all(work, workers, on_done=lambda job: bar.advance(task))
    summaries = {}
    for p in policies:
        runs = {s: results[(p, s)] for s in seed_list}
        summaries[p] = report.summarise(p, pods, seed_list, list(runs.values()))
        report.write_policy(out / p if len(policies) > 1 else out, summaries[p], runs)
    if len(policies) > 1:
        out.mkdir(parents=True, exist_ok=True)
        table = report.comparison_table(report.trace_name(pods), summaries)
        (out / "comparison.md").write_text(table)
        report.plot(list(summaries.values()), out / "comparison.png", f"all policies on {report.trace_name(pods)}")
        (out / "summary.json").write_text(json.dumps({"policies": summaries}, indent=1) + "\n")
        typer.echo(table)
    else:
        point = summaries[policy]["points"][100]
        typer.echo(
            f"{policy}: {point['unallocated_gpu_pct']:.2f}% of GPUs unallocated at 100% arrived "
            f"(sd {point['unallocated_gpu_pct_sd']:.2f}); results in {out}"
        )


@app.command()
def org(
    trace: Annotated[
        Path, typer.Option("--trace", help="Philly trace CSV (timestamp,duration,num_gpus,gpu_time,cluster).")
    ],
    out: Annotated[Path, typer.Option("--out", help="Directory for summary.json and the utilisation plot.")],
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs in the cluster (a multiple of 8).")] = 256,
    days: Annotated[float, typer.Option("--days", help="Days of the trace to replay.")] = 7.0,
    seed: Annotated[int, typer.Option("--seed", help="Seed for sampling and the synthetic mix.")] = 1,
    start_day: Annotated[float, typer.Option("--start-day", help="Day of the trace the replay starts at.")] = 35.0,
    estimates: Annotated[
        bool,
        typer.Option(
            "--estimates/--no-estimates",
            help="Forecast every waiting job's start under gpupool and measure the forecasts (eta_* figures); "
            "they change no decision but make a week's run several times longer.",
        ),
    ] = False,
    followers: Annotated[
        float,
        typer.Option(
            "--rightsizing-followers",
            help="Percent of the jobs that get right-sizing advice whose users follow it: adds a regime "
            "'rightsized' (gpupool, those jobs submitted with the advised request). 0: not run.",
        ),
    ] = 0.0,
    burst_gpus: Annotated[
        int,
        typer.Option(
            "--burst-gpus",
            help="Most GPUs rented at once from a cloud burst pool (whole 8-GPU nodes). Runs gpupool's rules once "
            "per --budget and prints a table instead of the three regimes. 0: no burst pool.",
        ),
    ] = 0,
    burst_price: Annotated[float, typer.Option("--burst-price", help="Burst price, dollars per GPU-hour.")] = 2.5,
    burst_delay: Annotated[float, typer.Option("--burst-delay", help="Seconds from asking to a ready node.")] = 300.0,
    burst_idle: Annotated[
        float, typer.Option("--burst-idle", help="Seconds a burst node stays empty before it goes back.")
    ] = 600.0,
    burst_after: Annotated[
        float, typer.Option("--burst-after", help="Every department's wait threshold: seconds before work bursts.")
    ] = 1800.0,
    budgets: Annotated[
        list[str] | None,
        typer.Option(
            "--budget",
            help="Monthly burst budget per department in dollars, pro-rated to the run (x days / 30); repeatable "
            "or comma-separated (0,1000,5000,20000), one run each; 'none' for no cap (the default).",
        ),
    ] = None,
    paced: Annotated[
        bool,
        typer.Option(
            "--budget-pacing/--no-budget-pacing",
            help="A budget accrues evenly over the run, as a monthly one over its month; off: all of it is "
            "available from the start.",
        ),
    ] = True,
    stop: Annotated[
        bool,
        typer.Option(
            "--budget-stop/--no-budget-stop",
            help="Stop a department's work on burst nodes once its budget is spent; off: let it finish (spending "
            "can pass the budget).",
        ),
    ] = True,
    jobs: Annotated[int, typer.Option("--jobs", help="Parallel processes for burst runs (default: all cores).")] = 0,
) -> None:
    """An organisation over time under three regimes: manual, quota and gpupool (and rightsized); with
    --burst-gpus, under gpupool with a cloud burst pool, once per budget."""
    import dataclasses
    import json

    from gpupool.sim.org import REGIMES, OrgSim
    from gpupool.sim.org_jobs import DAY, build
    from gpupool.sim.org_report import metrics, plot
    from gpupool.sim.org_util import followed, rightsize
    from gpupool.sim.traces import TraceError, load_philly

    if gpus < 8 or gpus % 8:
        err.print("[red]error:[/] --gpus must be a positive multiple of 8")
        raise typer.Exit(2)
    if not 0 < days <= 60:
        err.print("[red]error:[/] --days must be more than 0 and at most 60")
        raise typer.Exit(2)
    if not 0 <= followers <= 100:
        err.print("[red]error:[/] --rightsizing-followers must be a percent from 0 to 100")
        raise typer.Exit(2)
    monthly = _burst_args(burst_gpus, (burst_price, burst_delay, burst_idle, burst_after), budgets, followers)
    try:
        trace_jobs = load_philly(trace)
    except TraceError as e:
        err.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from None
    organisation = build(trace_jobs, gpus, days, seed, start_day=start_day)
    header = {"trace": str(trace), "gpus": gpus, "days": days, "seed": seed, "start_day": start_day}
    if burst_gpus:
        from gpupool.sim.org import GPU_MODEL
        from gpupool.sim.org_burst_report import BurstRun, burst_pool

        pool = burst_pool(burst_gpus, burst_price, burst_delay, burst_idle, GPU_MODEL)
        runs = [BurstRun(organisation, gpus, days, pool, burst_after, b, estimates, paced, stop) for b in monthly]
        _burst_table(runs, out, {**header, "jobs": len(organisation.jobs)}, jobs)
        return
    regimes = [(name, regime, organisation) for name, regime in REGIMES.items()]
    if followers > 0:
        rightsized = dataclasses.replace(REGIMES["gpupool"], name="rightsized", estimates=False)
        regimes.append(("rightsized", rightsized, rightsize(organisation, followers, seed)))
    sims: dict[str, OrgSim] = {}
    horizon = days * DAY
    with _progress() as bar:
        for name, regime, work in regimes:
            regime = dataclasses.replace(regime, estimates=regime.estimates and estimates)
            task = bar.add_task(f"{name:>10}", total=round(horizon / 3600))
            sim = OrgSim(work, regime, gpus, horizon)

            def advance(now: float, task: TaskID = task) -> None:
                bar.update(task, completed=round(now / 3600))

            sim.run(progress=advance)
            bar.update(task, completed=round(horizon / 3600))
            sims[name] = sim
    out.mkdir(parents=True, exist_ok=True)
    results = {name: metrics(sim) for name, sim in sims.items()}
    if followers > 0:
        results["rightsized"]["rightsizing_followers_pct"] = followers
        results["rightsized"]["rightsized_jobs"] = followed(organisation, sims["rightsized"].org)
    summary = {**header, "jobs": len(organisation.jobs), "regimes": results}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot(sims, out / "utilisation.png")
    for name, m in results.items():
        typer.echo(
            f"{name:>10}: {m['gpu_allocation_pct']:5.1f}% of GPU-hours allocated, {m['busy_gpu_pct']:5.1f}% busy, "
            f"{m['gpu_allocation_pct_while_waiting']:5.1f}% allocated while work waits, "
            f"wait p50 {m['wait_p50_s']:.0f} s p95 {m['wait_p95_s']:.0f} s, mean JCT {m['mean_jct_s'] or 0:.0f} s, "
            f"{m['preemptions_per_100_jobs']} preemptions per 100 jobs"
        )


def _burst_args(
    burst_gpus: int, settings: tuple[float, float, float, float], budgets: list[str] | None, followers: float
) -> list[float | None]:
    """The monthly budgets to run (None: no cap), after checking the burst options; exits on a bad one."""

    def refuse(message: str) -> NoReturn:
        err.print(f"[red]error:[/] {message}")
        raise typer.Exit(2)

    if burst_gpus < 0 or burst_gpus % 8:
        refuse("--burst-gpus must be a multiple of 8 (burst nodes have 8 GPUs), or 0 for none")
    if not burst_gpus:
        if budgets:
            refuse("--budget needs a burst pool (--burst-gpus)")
        return []
    if followers > 0:
        refuse("--rightsizing-followers and --burst-gpus are separate experiments; run them apart")
    if min(settings) < 0:
        refuse("--burst-price, --burst-delay, --burst-idle and --burst-after must not be negative")
    out: list[float | None] = []
    for item in ",".join(budgets or ["none"]).split(","):
        text = item.strip().lower()
        if text in ("none", "unlimited"):
            out.append(None)
            continue
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not 0 <= value < float("inf"):
            refuse(f"--budget takes dollars per month (0 or more) or 'none', not {item.strip()!r}")
        out.append(value)
    return out


def _burst_table(runs: list[BurstRun], out: Path, header: dict[str, Any], jobs: int) -> None:
    """Run every budget, write summary.json and the utilisation plot, print the table and a JSON line."""
    import json

    from gpupool.sim import org_burst_report as report
    from gpupool.sim.org_report import plot_hourly

    workers = min(len(runs), jobs if jobs > 0 else (os.cpu_count() or 1))
    with _progress() as bar:
        task = bar.add_task("burst budgets", total=len(runs))
        results = report.run_all(runs, workers, on_done=lambda run: bar.advance(task))
    rows = [report.row(run, m) for run, (m, _) in zip(runs, results, strict=True)]
    pool = runs[0].pool
    summary = {
        **header,
        "burst": {
            "pool": {
                "max_gpus": pool.max_gpus,
                "node_gpus": pool.node_gpus,
                "price_usd_per_gpu_hour": pool.price_micro / 1_000_000,
                "delay_s": pool.delay_s,
                "idle_release_s": pool.idle_release_s,
            },
            "wait_threshold_s": runs[0].wait_threshold_s,
            "budget_paced": runs[0].paced,
            "budget_stop": runs[0].stop,
            "runs": [{**r, "figures": m} for r, (m, _) in zip(rows, results, strict=True)],
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot_hourly({f"budget {run.label}": h for run, (_, h) in zip(runs, results, strict=True)}, out / "utilisation.png")
    typer.echo(report.table(rows, runs[0].days), nl=False)
    typer.echo(json.dumps({"burst": rows}))
