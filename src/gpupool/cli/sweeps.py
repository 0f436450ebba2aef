"""`gpupool sweep`: hyperparameter sweeps, Optuna studies whose trials run as batch workloads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from gpupool.cli.connection import (
    Output,
    OutputOpt,
    client,
    default_project,
    emit_json,
    fail,
    print_table,
    read_mapping,
)
from gpupool.models.sweeps import SweepCreate, SweepPublic, TrialPublic

sweep_app = typer.Typer(
    help="Hyperparameter sweeps: `gpupool sweep -f sweep.yaml` starts one; list, describe and cancel them.",
    invoke_without_command=True,
)

ProjectOpt = Annotated[str | None, typer.Option("--project", "-p", help="Its project ($GPUPOOL_PROJECT).")]


@sweep_app.callback()
def sweep_start(
    ctx: typer.Context,
    file: Annotated[Path | None, typer.Option("--file", "-f", help="The sweep's YAML (- for stdin).")] = None,
    output: Output = OutputOpt,
) -> None:
    """Start the sweep a YAML file describes: name, project, command (with {param} for each parameter), space,
    metric, direction, trials, parallelism, sampler, pruner, gpu or gpus, priority, image, env."""
    if ctx.invoked_subcommand is not None:
        return
    if file is None:
        print(ctx.get_help())
        raise typer.Exit(2)
    data = read_mapping(file, "sweep fields (name, project, command, space, trials, ...)")
    data.setdefault("project", default_project())
    try:
        body = SweepCreate.model_validate(data)
    except ValidationError as e:
        fail("; ".join(f"{file}: {'.'.join(str(x) for x in err['loc']) or 'sweep'}: {err['msg']}"
                       for err in e.errors()), 2)  # fmt: skip
    with client() as c:
        made = c.create_sweep(body)
    if output is Output.json:
        emit_json(made)
    else:
        print(f"sweep {made.project}/{made.name} started: {made.trials} trials, {made.parallelism} at a time")


def _project(project: str | None) -> str:
    chosen = project or default_project()
    if chosen is None:
        fail("say which project with -p PROJECT (or set GPUPOOL_PROJECT)", 2)
    return chosen


def _value(v: float | None) -> str:
    return "-" if v is None else f"{v:.6g}"


def _row(s: SweepPublic) -> list[str]:
    counts = ", ".join(f"{n} {k}" for k, n in s.counts.items()) or "-"
    best = "-" if s.best is None else f"{_value(s.best.value)} (trial {s.best.number})"
    return [f"{s.project}/{s.name}", s.state.value, f"{s.metric} ({s.direction})", counts, best]


@sweep_app.command("list")
def sweep_list(output: Output = OutputOpt) -> None:
    """The sweeps of the projects you read."""
    with client() as c:
        rows = c.list_sweeps()
    if output is Output.json:
        emit_json(rows)
        return
    print_table(None, ["SWEEP", "STATE", "METRIC", "TRIALS", "BEST"], [_row(s) for s in rows])


def _params(t: TrialPublic) -> str:
    return " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(t.params.items()))


@sweep_app.command("describe")
def sweep_describe(
    name: str,
    project: ProjectOpt = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write its optimisation history here (PNG).")] = None,
    output: Output = OutputOpt,
) -> None:
    """A sweep: its best trial, and every trial with its parameters, state and value."""
    with client() as c:
        d = c.describe_sweep(_project(project), name)
        if plot is not None:
            png = c.sweep_plot(d.project, d.name)
            try:
                plot.write_bytes(png)
            except OSError as e:
                fail(f"cannot write {plot}: {e.strerror}", 2)
    if output is Output.json:
        emit_json(d)
        return
    print(f"Sweep:      {d.project}/{d.name} ({d.state.value})")
    print(f"Objective:  {d.direction} {d.metric}, {d.trials} trials, {d.parallelism} at a time")
    print(f"Sampler:    {d.spec.sampler.kind}; pruner: {d.spec.pruner.kind}")
    if d.best is not None:
        print(f"Best:       trial {d.best.number}: {_value(d.best.value)} with {_params(d.best)}")
    rows = [[str(t.number), t.state, _value(t.value), "-" if t.last_step is None else str(t.last_step),
             _params(t), t.workload or "-"] for t in d.trial_list]  # fmt: skip
    print_table(None, ["TRIAL", "STATE", "VALUE", "STEP", "PARAMS", "WORKLOAD"], rows)
    for t in d.trial_list:  # why one failed, or took its last report for its value (a pruned one's STEP says it)
        if t.reason and t.state != "pruned":
            print(f"trial {t.number}: {t.reason}")
    if plot is not None:
        print(f"plot written to {plot}")


@sweep_app.command("cancel")
def sweep_cancel(name: str, project: ProjectOpt = None, output: Output = OutputOpt) -> None:
    """No new trial starts, and the running ones are stopped."""
    with client() as c:
        s = c.cancel_sweep(_project(project), name)
    emit_json(s) if output is Output.json else print(f"sweep {s.project}/{s.name} {s.state.value}")
