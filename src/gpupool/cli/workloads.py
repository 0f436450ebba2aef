"""Listing, describing and following workloads, and the GPU map (submitting them: gpupool.cli.submit)."""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Annotated

import typer
from rich.console import Console

from gpupool.cli.connection import Output, OutputOpt, client, emit_json, fail, print_table
from gpupool.cli.submit import ProjectOpt
from gpupool.cli.table import Column, print_fitted, terminal_width
from gpupool.client import Client
from gpupool.client.code import human
from gpupool.durations import format_duration
from gpupool.lifecycle.events import EventCode
from gpupool.lifecycle.phases import QUEUED, Phase
from gpupool.models.schemas import EventPublic, WorkloadDetail, WorkloadPublic
from gpupool.models.wire import states_named

LOG_TAIL = 20
"""Lines of a failed workload's log that `describe` shows."""


def _age(since: float) -> str:
    return format_duration(time.time() - since)


_BASIS = {
    "declared": "from declared max durations and minimum runtimes",
    "history": "from the runtimes of the project's finished work",
    "none": "nothing running is expected to end",
}


def _span(seconds: float) -> str:
    return format_duration(seconds, smallest="m")


def eta_text(w: WorkloadPublic, now: float | None = None) -> str:
    """A queued workload's estimated start, relative: "in 2h10m (history)"; "-" for any other."""
    if w.state not in QUEUED or w.eta_basis is None:
        return "-"
    if w.eta is None:
        return "unknown"
    return f"{_relative(w.eta.timestamp(), now)} ({w.eta_basis})"


def _relative(at: float, now: float | None = None) -> str:
    left = at - (time.time() if now is None else now)
    return f"in {_span(left)}" if left >= 60 else "now"


def list_(
    project: ProjectOpt = None,
    state: Annotated[
        list[str] | None,
        typer.Option("--state", help="Only workloads in these states: repeat it, or separate them with commas."),
    ] = None,
    mine: Annotated[bool, typer.Option("--mine", help="Only the workloads you submitted.")] = False,
    user: Annotated[str | None, typer.Option("--user", help="Only the workloads this user submitted.")] = None,
    watch: Annotated[bool, typer.Option("-w", "--watch", help="Refresh every 2 seconds until Ctrl-C.")] = False,
    all_runs: Annotated[
        bool, typer.Option("--all-runs", help="Every run of each name (NAME #N), not its newest only.")
    ] = False,
    output: Output = OutputOpt,
) -> None:
    """List workloads you can see, newest first: a name once, as its newest run, with RUNS where it has had
    several. Names are never cut: columns that do not fit the terminal are left out instead (PRIORITY, TYPE, ETA,
    OWNER, NODE/DEVICES, PROJECT, GPUS, RUNS, AGE, in that order)."""
    try:
        states = states_named(state or [])
    except ValueError as e:
        fail(f"--state {e}", 2)
    if mine and user is not None:
        fail("--mine and --user: give one or the other", 2)
    with client() as c:
        owner = c.whoami().name if mine else user
        if watch:
            _watch(lambda: c.list_workloads(project, states, user=owner, all_runs=all_runs), output, all_runs)
            return
        rows = c.list_workloads(project, states, user=owner, all_runs=all_runs)
    if output is Output.json:
        emit_json(rows)
        return
    print_list(rows, all_runs=all_runs)


WATCH_EVERY_S = 2.0


def _watch(fetch: Callable[[], list[WorkloadPublic]], output: Output, all_runs: bool = False) -> None:
    """Print the list again every WATCH_EVERY_S (over the last one on a terminal) until Ctrl-C, which ends it
    quietly: watching has no other way to end."""
    console = Console(width=terminal_width())
    try:
        while True:
            rows = fetch()
            if console.is_terminal:
                console.clear()
            if output is Output.json:
                emit_json(rows)
            else:
                print(f"every {WATCH_EVERY_S:g}s, Ctrl-C to stop; {time.strftime('%H:%M:%S')}")
                print_list(rows, console, all_runs)
            sys.stdout.flush()
            time.sleep(WATCH_EVERY_S)  # the refresh interval, not a wait for anything
    except KeyboardInterrupt:
        print()


LIST_COLUMNS = (
    Column("NAME"), Column("PROJECT", drop=4), Column("OWNER", drop=6), Column("TYPE", drop=8),
    Column("PRIORITY", drop=9), Column("STATE"), Column("GPUS", drop=3), Column("NODE/DEVICES", drop=5),
    Column("REASON", drop=1, wrap=True), Column("ETA", drop=7), Column("AGE", drop=2),
)  # fmt: skip


RUNS = Column("RUNS", drop=2)
"""Shown where a listed name has had several runs: right after NAME, and dropped just before AGE."""


def _name(w: WorkloadPublic, every: bool) -> str:
    """Its name; listing every run, a run of a name that has had several is NAME #N, so two are told apart."""
    return f"{w.name} #{w.run}" if every and w.runs > 1 else w.name


def print_list(rows: Sequence[WorkloadPublic], console: Console | None = None, all_runs: bool = False) -> None:
    """The table `list` prints: a queued workload's REASON is its blocker in a few words, a live one's its node.
    It fits the terminal's width by leaving columns out (LIST_COLUMNS' drop order), never by cutting a name.
    A name with several runs shows how many in RUNS, or, listing every run, each as NAME #N."""
    several = any(w.runs > 1 for w in rows) and not all_runs
    cells = [
        (_name(w, all_runs), *((str(w.runs),) if several else ()), w.project, w.owner or "-", w.type, w.priority,
         w.state, w.gpu_request, f"{w.node}:{','.join(map(str, w.devices))}" if w.node else "-",
         w.reason_short if w.state in QUEUED else "-", eta_text(w), _age(w.created_at))
        for w in rows
    ]  # fmt: skip
    columns = (LIST_COLUMNS[0], RUNS, *LIST_COLUMNS[1:]) if several else LIST_COLUMNS
    print_fitted(columns, cells, console)


def describe_text(d: WorkloadDetail) -> None:
    """What `describe` prints."""
    fmt = "%Y-%m-%d %H:%M:%S"
    print(f"Name:        {d.name}  (id {d.id})")
    if d.runs > 1:
        print(f"Run:         {d.run} of {d.runs} of its name")
    print(f"Project:     {d.project}" + (f", submitted by {d.owner}" if d.owner else ""))
    if d.origin is not None:
        print(f"Origin:      {d.origin.kind} {d.origin.namespace}/{d.origin.name}")
        if d.origin.pods:
            print(f"Pods:        {', '.join(d.origin.pods)}")
    print(f"Type:        {d.type}, priority {d.priority}, {'preemptible' if d.preemptible else 'not preemptible'}")
    print(f"State:       {d.state}" + (f" (attempt {d.attempt + 1})" if d.attempt else ""))
    print(f"Reason:      {d.reason}" + (f" [{d.reason_code}]" if d.reason_code else ""))
    if d.reason_args:
        print(f"Numbers:     {' '.join(f'{k}={v}' for k, v in d.reason_args.items())}")
    if d.position is not None:
        print(
            f"Position:    {d.position.project} of {d.position.project_queued} in project {d.project}'s queue "
            "(by priority, then submit time)"
        )
    if d.state in QUEUED and d.eta_basis is not None:
        when = "none while the reason above holds" if d.eta is None else (
            f"{d.eta.astimezone().strftime(fmt)}, {_relative(d.eta.timestamp())}"
        )  # fmt: skip
        print(f"ETA:         {when} ({d.eta_basis}: {_BASIS.get(d.eta_basis, '')})")
    print(f"GPUs:        {d.gpu_request}" + (f" (fraction {d.fraction})" if d.fraction else ""))
    asked = resources_text(d)
    if asked:
        print(f"Resources:   {asked}")
    if d.image:
        print(f"Image:       {d.image}")
    if d.mlflow_run_url:
        print(f"MLflow run:  {d.mlflow_run_url}")
    if d.model:
        print(f"Model:       {d.model}")
    if d.rightsizing is not None:
        print(f"Right-size:  {d.rightsizing.message}")
    for a in d.allocations:
        devs = ", ".join(f"{x.index} ({x.milli / 1000:g})" for x in a.devices) or "none"
        print(f"Member {a.member}:    {a.node}, devices {devs}, {a.state}" + (f", port {a.port}" if a.port else ""))
    if d.gpu_util_pct is not None:
        print(
            f"GPU use:     {d.gpu_util_pct}% of its share"
            + (f", {d.gpu_memory_used_mib} MiB" if d.gpu_memory_used_mib else "")
        )
    limits = []
    if d.idle_timeout_s is not None:
        what = "suspended" if d.type == "notebook" else "stopped"
        limits.append(f"{what} after {format_duration(d.idle_timeout_s)} below {d.idle_threshold_pct}% GPU")
    if d.max_runtime_s is not None:
        limits.append(f"runs at most {format_duration(d.max_runtime_s)}")
    if d.max_duration_s is not None:
        limits.append(f"declared max duration {format_duration(d.max_duration_s)}")
    if limits:
        idle = (
            f"; idle for {format_duration(time.time() - d.idle_since)} now"
            if d.idle_since and d.state == Phase.RUNNING
            else ""
        )
        print(f"Policy:      {', '.join(limits)}{idle}")
    if d.command:
        print(f"Command:     {' '.join(d.command)}")
    if d.code:
        print(f"Code:        {d.code[:19]}… ({d.code_files} files, {human(d.code_bytes or 0)})")
    if d.url:
        print(f"URL:         {d.url}")
    if d.exit_code is not None:
        print(f"Exit code:   {d.exit_code}")
    if len(d.attempts) > 1:
        print("Attempts:")
        for t in d.attempts:
            ran = "not started" if t.started is None else f"ran {format_duration((t.ended or time.time()) - t.started)}"
            how = f"{t.outcome}" + (f" (exit {t.exit_code})" if t.exit_code is not None else "")
            print(f"  {t.number:<3} {how}, {ran}" + ("; retried" if t.retried else ""))
    if d.history:
        print("Earlier runs:")
        for number, h in enumerate(d.history, start=1):
            exit_code = f", exit {h.exit_code}" if h.exit_code is not None else ""
            ended = time.strftime(fmt, time.localtime(h.finished_at)) if h.finished_at else "-"
            print(f"  #{number:<2} id {h.id}  {h.state}{exit_code}, {ended}")
    if d.isolation:
        print("Isolation:")
        for what, how in d.isolation.items():
            print(f"  {what + ':':<12} {how}")
    print("Events:")
    for e in d.events:
        print(f"  {time.strftime(fmt, time.localtime(e.at))}  {e.state:<10} {e.reason}{start_note(e)}")


def resources_text(d: WorkloadDetail) -> str:
    """What it asked for besides GPUs, per member: "cpu 0.5, memory 1 GiB, pools a, b, GPU models H100"."""
    parts = []
    if d.cpu_milli:
        parts.append(f"cpu {d.cpu_milli / 1000:g}")
    if d.memory_mib:
        mib = d.memory_mib
        parts.append(f"memory {mib // 1024} GiB" if mib % 1024 == 0 else f"memory {mib} MiB")
    if d.pools:
        parts.append(f"pool{'s' if len(d.pools) > 1 else ''} {', '.join(d.pools)}")
    if d.gpu_models:
        parts.append(f"GPU model{'s' if len(d.gpu_models) > 1 else ''} {', '.join(d.gpu_models)}")
    return "; ".join(parts)


def _wait(seconds: float) -> str:
    return format_duration(seconds)


def start_note(e: EventPublic) -> str:
    """A start's actual wait beside the estimate it had (the scheduler records both in the start event)."""
    a = e.args
    if e.code != EventCode.PLACED or a.get("waited_s") is None:
        return ""
    waited = f"; waited {_wait(float(a['waited_s']))}"
    if a.get("estimated_wait_s") is None:
        return f"{waited}, with no estimate"
    return f"{waited}, estimated {_wait(float(a['estimated_wait_s']))} ({a.get('eta_basis')})"


def describe(name: str, project: ProjectOpt = None, output: Output = OutputOpt) -> None:
    """Everything about one workload, including why it is pending, and the end of its log if it failed."""
    with client() as c:
        d = c.describe(name, project)
        if output is Output.json:
            emit_json(d)
            return
        describe_text(d)
        if d.state == Phase.FAILED:
            rank = failed_member(d)
            lines = log_tail(c, d, rank)
            print(f"Log of member {rank} (last {LOG_TAIL} lines):" if lines else f"Log of member {rank}: empty")
            for line in lines:
                print(f"  {line}")


def failed_member(d: WorkloadDetail) -> int:
    """The member whose exit failed the workload (its last failure event says), else the first."""
    for e in reversed(d.events):
        if isinstance(e.args.get("member"), int) and e.args.get("exit_code") != 0:
            return int(e.args["member"])
    return 0


def _chunks(c: Client, ref: str, project: str | None, rank: int) -> tuple[list[bytes], str]:
    """A member's whole log so far, as the server hands it out, and the workload's state."""
    out: list[bytes] = []
    offset = 0
    while True:
        data, offset, state = c.logs(ref, project, rank, offset)
        if not data:
            return out, state
        out.append(data)


def log_tail(c: Client, d: WorkloadDetail, rank: int, lines: int = LOG_TAIL) -> list[str]:
    chunks, _ = _chunks(c, d.name, d.project, rank)
    return list(deque(b"".join(chunks).decode(errors="replace").splitlines(), maxlen=lines))


def logs(
    name: str,
    project: ProjectOpt = None,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep streaming until it ends.")] = False,
    rank: Annotated[int, typer.Option("--rank", help="Which gang member.")] = 0,
) -> None:
    """Print a workload's output; with -f, stream it as it is written until the workload ends. Of a workload
    that has not started, say so and why (on stderr)."""
    out = sys.stdout.buffer
    with client() as c:
        chunks, state = _chunks(c, name, project, rank)
        if not chunks and state in QUEUED:
            d = c.describe(name, project)
            waiting = "; its output follows once it starts" if follow else ""
            print(f"{d.name} is {d.state}, no output yet: {d.reason}{waiting}", file=sys.stderr, flush=True)
        for data in chunks:
            out.write(data)
        out.flush()
        if follow:
            for data in c.follow_logs(name, project, rank, sum(len(d) for d in chunks)):
                out.write(data)
                out.flush()


def cancel(name: str, project: ProjectOpt = None, output: Output = OutputOpt) -> None:
    """Cancel a workload: pending ones at once, running ones after SIGTERM and their grace period."""
    with client() as c:
        w = c.cancel(name, project)
    emit_json(w) if output is Output.json else print(f"workload {w.name}: {w.state} ({w.reason})")


def resume(name: str, project: ProjectOpt = None, output: Output = OutputOpt) -> None:
    """Bring back a workload a policy suspended (an idle notebook, say), with its files."""
    with client() as c:
        w = c.resume(name, project)
    emit_json(w) if output is Output.json else print(f"workload {w.name}: {w.state} ({w.reason})")


def open_(name: str, project: ProjectOpt = None) -> None:
    """Print the URL of a notebook or inference endpoint."""
    with client() as c:
        d = c.describe(name, project)
    if d.type not in ("notebook", "inference"):
        fail(f"{d.name} is a {d.type} workload; only notebooks and inference services have a URL")
    if not d.url:
        fail(f"{d.name} is {d.state}: it has no URL until it runs ({d.reason})")
    print(d.url)


def nodes(output: Output = OutputOpt) -> None:
    """The GPU map: every device, its model, how much is allocated and to what."""
    with client() as c:
        rows = c.nodes()
    if output is Output.json:
        emit_json(rows)
        return
    print_table(
        "GPUs",
        ("NODE", "POOL", "DEVICE", "MODEL", "MEMORY", "ALLOCATED", "WORKLOADS"),
        (
            (n.name, n.pool, str(d.index), d.model, f"{d.memory_mib // 1024} GiB", f"{d.allocated_milli / 1000:g}",
             ", ".join(d.workloads) or "-")
            for n in rows
            for d in n.devices
        ),
    )  # fmt: skip
