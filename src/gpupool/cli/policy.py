"""Idle and runtime policies (`gpupool project policy`, `gpupool department policy`), usage and right-sizing
reports."""

from __future__ import annotations

import csv
import sys
from datetime import UTC, datetime
from typing import Annotated

import typer

from gpupool.cli.connection import Output, OutputOpt, client, emit_json, fail, print_table
from gpupool.cli.submit import TYPES
from gpupool.durations import format_duration, parse_duration
from gpupool.models.rightsizing import RightsizingLine
from gpupool.models.schemas import BudgetLine, PolicyPublic, PolicyUpdate

report_app = typer.Typer(help="Usage, cost and right-sizing reports.", no_args_is_help=True)


def _limits(items: list[str] | None, flag: str) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for item in items or []:
        kind, sep, value = item.partition("=")
        if not sep or kind not in TYPES:
            fail(f"{flag} {item!r}: expected TYPE=DURATION (or TYPE=none), TYPE one of {', '.join(TYPES)}", 2)
        try:
            out[kind] = None if value in ("none", "off", "") else parse_duration(value)
        except ValueError as e:
            fail(f"{flag} {item!r}: {e}", 2)
    return out


def _show(p: PolicyPublic) -> None:
    print(f"policy of {p.queue} (effective; set by):")
    for kind in TYPES:
        idle = p.idle_timeout_s.get(kind)
        run = p.max_runtime_s.get(kind)
        if idle is None and run is None:
            continue
        parts = []
        if idle is not None:
            parts.append(f"idle timeout {format_duration(idle)} ({p.source.get('idle_timeout.' + kind, '?')})")
        if run is not None:
            parts.append(f"max runtime {format_duration(run)} ({p.source.get('max_runtime.' + kind, '?')})")
        print(f"  {kind:<10} " + ", ".join(parts))
    print(f"  idle below {p.idle_threshold_pct}% GPU utilisation")


def policy(
    name: str,
    idle_timeout: Annotated[
        list[str] | None, typer.Option("--idle-timeout", help="TYPE=DURATION, e.g. notebook=30m (repeatable).")
    ] = None,
    max_runtime: Annotated[
        list[str] | None, typer.Option("--max-runtime", help="TYPE=DURATION, e.g. training=24h (repeatable).")
    ] = None,
    threshold: Annotated[
        int | None, typer.Option("--idle-threshold", help="Percent GPU utilisation below which work is idle.")
    ] = None,
    output: Output = OutputOpt,
) -> None:
    """Show, or set (admins), the idle and runtime limits of a department or project."""
    body = None
    if idle_timeout or max_runtime or threshold is not None:
        body = PolicyUpdate(
            idle_timeout_s=_limits(idle_timeout, "--idle-timeout"),
            max_runtime_s=_limits(max_runtime, "--max-runtime"),
            idle_threshold_pct=threshold,
        )
    with client() as c:
        p = c.get_policy(name) if body is None else c.update_policy(name, body)
    emit_json(p) if output is Output.json else _show(p)


def _when(text: str) -> float:
    if text == "now":
        return datetime.now(UTC).timestamp()
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        fail(f"{text!r}: expected a date or time like 2026-11-01 or 2026-11-01T09:00 (UTC), or now", 2)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


@report_app.command("usage")
def usage(
    start: Annotated[
        str | None, typer.Option("--from", help="Start, ISO date or time (UTC); default a day before --to.")
    ] = None,
    end: Annotated[str, typer.Option("--to", help="End, ISO date or time (UTC), or now.")] = "now",
    by: Annotated[str, typer.Option("--by", help="department, project, user or workload.")] = "project",
    output: Annotated[str, typer.Option("-o", "--output", help="table, json or csv.")] = "table",
) -> None:
    """GPU-hours and cost by department, project or user, split into busy and idle-allocated, and into on-premises
    (priced per pool) and burst (rented nodes, at their price); then each department's burst budget: spent and
    forecast this month, the rate of what it holds now, rented and unused in the period."""
    if output not in ("table", "json", "csv"):
        fail("-o must be table, json or csv", 2)
    # What is not given is the server's to fill in, by its clock: the day to now.
    with client() as c:
        report = c.usage(None if start is None else _when(start), None if end == "now" else _when(end), by)
    if output == "json":
        emit_json(report)
        return
    lines = [*report.lines, report.total]
    if output == "csv":
        writer = csv.writer(sys.stdout)
        writer.writerow([by if col == "key" else col for col in _USAGE_COLUMNS])
        for line in lines:
            writer.writerow([getattr(line, col) for col in _USAGE_COLUMNS])
        return
    # By workload, a line is a name: its runs (a finished name submitted again, or rerun) are summed into it.
    runs = by == "workload"
    print_table(
        f"usage by {by}, {_utc(report.start)} to {_utc(report.end)} UTC",
        (by.upper(), *(("RUNS",) if runs else ()), "GPU-HOURS", "BUSY", "IDLE", "COST", "ON-PREM", "BURST",
         "BUSY COST", "IDLE COST"),
        ((line.key, *((str(line.runs),) if runs else ()), *(f"{getattr(line, col):.2f}" for col in _USAGE_TABLE))
         for line in lines),
    )  # fmt: skip
    if report.unpriced_pools:
        pools = ", ".join(report.unpriced_pools)
        example = report.unpriced_pools[0]
        print(f"note: no price is set for pool {pools}, so its cost counts as 0.00; the server prices a GPU-hour "
              f"with --price {example}=DOLLARS (e.g. gpupool server --price {example}=2.50)")  # fmt: skip
    if report.budgets:
        print_table(
            "burst budgets (spent, forecast: this month to now; rented, unused: the period)",
            ("DEPARTMENT", "BUDGET/MONTH", "SPENT", "FORECAST", "RATE/HOUR", "RENTED", "UNUSED", "REFUSED"),
            (_budget_cells(b) for b in report.budgets),
        )


def _utc(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%d %H:%M")


_USAGE_COLUMNS = (
    "key", "gpu_hours", "busy_gpu_hours", "idle_gpu_hours", "cost", "busy_cost", "idle_cost", "on_prem_cost",
    "burst_cost", "burst_gpu_hours", "runs",
)  # fmt: skip
"""The CSV's: those of earlier releases first, in their order."""
_USAGE_TABLE = ("gpu_hours", "busy_gpu_hours", "idle_gpu_hours", "cost", "on_prem_cost", "burst_cost", "busy_cost",
                "idle_cost")  # fmt: skip


def _money(dollars: float | None) -> str:
    return "-" if dollars is None else f"${dollars:,.2f}"


def _budget_cells(b: BudgetLine) -> tuple[str, ...]:
    return (
        b.department, _money(b.monthly_budget), _money(b.spent), _money(b.forecast), _money(b.rate_per_hour),
        _money(b.rented_cost), _money(b.unused_cost), b.refused or "-",
    )  # fmt: skip


_RIGHTSIZING_COLUMNS = (
    "project", "workload", "state", "request", "workers", "sampled_minutes", "peak_gpu_memory_mib",
    "peak_gpu_util_pct", "busy_pct", "gpu_hours", "freed_gpu_hours",
)  # fmt: skip
ProjectFilter = Annotated[str | None, typer.Option("-p", "--project", help="One project (default: all you read).")]
Since = Annotated[str | None, typer.Option("--from", help="Start, ISO date or time (UTC); default a week ago.")]
Until = Annotated[str, typer.Option("--to", help="End, ISO date or time (UTC), or now.")]
Fmt = Annotated[str, typer.Option("-o", "--output", help="table, json or csv (one row per workload).")]


def _maybe(value: object, fmt: str = "{}") -> str:
    return "-" if value is None else fmt.format(value)


def _rightsizing_row(line: RightsizingLine) -> list[object]:
    a = line.advice
    advised = (a.gpus, a.gpu, a.gpu_memory_mib, a.message) if a else (None, None, None, None)
    return [*(getattr(line, col) for col in _RIGHTSIZING_COLUMNS), *("" if v is None else v for v in advised)]


def _rightsizing_cells(x: RightsizingLine) -> tuple[str, ...]:
    return (
        x.project, x.workload, x.request, _maybe(x.peak_gpu_memory_mib, "{} MiB"), _maybe(x.peak_gpu_util_pct, "{}%"),
        _maybe(x.busy_pct, "{:g}%"), f"{x.gpu_hours:.2f}", f"{x.freed_gpu_hours:.2f}",
        x.advice.message if x.advice else "-",
    )  # fmt: skip


@report_app.command("rightsizing")
def rightsizing(project: ProjectFilter = None, start: Since = None, end: Until = "now", output: Fmt = "table") -> None:
    """Workloads whose peak GPU memory or utilisation stayed far under their request, the request that would do,
    and the GPU-hours it would have freed, per project.

    Advice comes after 30 minutes of samples:

    - one GPU or less per worker, peak memory under half of it, under 30% busy: `--gpu-memory` or `--gpu`;

    - several whole GPUs per worker, fewer ever busy at once: `--gpus k`."""
    if output not in ("table", "json", "csv"):
        fail("-o must be table, json or csv", 2)
    until = _when(end)
    with client() as c:
        report = c.rightsizing(project, _when(start) if start is not None else until - 7 * 86400, until)
    if output == "json":
        emit_json(report)
        return
    if output == "csv":
        writer = csv.writer(sys.stdout)
        writer.writerow([*_RIGHTSIZING_COLUMNS, "advised_gpus", "advised_gpu", "advised_gpu_memory_mib", "advice"])
        writer.writerows(_rightsizing_row(line) for line in report.lines)
        return
    print_table(
        "right-sizing",
        ("PROJECT", "WORKLOAD", "REQUEST", "PEAK MEM", "PEAK UTIL", "BUSY", "GPU-HOURS", "FREED", "ADVICE"),
        (_rightsizing_cells(x) for x in report.lines),
    )
    totals = [*report.projects, report.total]
    print_table(
        "GPU-hours right-sizing would have freed",
        ("PROJECT", "GPU-HOURS", "FREED", "ADVISED"),
        ((t.project, f"{t.gpu_hours:.2f}", f"{t.freed_gpu_hours:.2f}", str(t.advised)) for t in totals),
    )
