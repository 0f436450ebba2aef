"""Submitting and following workloads, and the GPU map."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pydantic import ValidationError

from gpupool.cli.connection import Output, OutputOpt, client, emit_json, fail, load_config, print_table
from gpupool.cli.policy import parse_duration
from gpupool.client import Client
from gpupool.lifecycle.events import EventCode, duration
from gpupool.lifecycle.phases import QUEUED, Phase
from gpupool.models.schemas import EventPublic, WorkloadCreate, WorkloadDetail, WorkloadPublic

ProjectOpt = Annotated[str | None, typer.Option("-p", "--project", help="The project (default: your only one).")]


def _project(c: Client, project: str | None) -> str:
    if project:
        return project
    if load_config().get("project"):
        return str(load_config()["project"])
    mine = c.whoami().projects
    if len(mine) == 1:
        return mine[0]
    fail("say which project with -p PROJECT" + (f" (yours: {', '.join(mine)})" if mine else ""), 2)


def _validation(e: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(x) for x in err['loc']) or 'workload'}: {err['msg']}" for err in e.errors())


def _submitted(w: Any, output: Output) -> None:
    if output is Output.json:
        emit_json(w)
    else:
        print(f"workload {w.name} submitted to {w.project} ({w.type}, {w.gpu_request}, {w.priority}): {w.state}")


def submit(
    command: Annotated[list[str] | None, typer.Argument(help="The command to run, after --.")] = None,
    project: ProjectOpt = None,
    name: Annotated[str | None, typer.Option("--name", help="A DNS-safe name (default: generated).")] = None,
    type_: Annotated[str, typer.Option("--type", help="notebook, training, inference or batch.")] = "training",
    gpu: Annotated[float | None, typer.Option("--gpu", help="A fraction of one GPU, e.g. 0.25.")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", help="Whole GPUs (per worker).")] = None,
    gpu_memory: Annotated[str | None, typer.Option("--gpu-memory", help="GPU memory, e.g. 20GiB.")] = None,
    workers: Annotated[int, typer.Option("--workers", help="Gang members, started all at once.")] = 1,
    priority: Annotated[
        str | None, typer.Option("--priority", help="production, training, interactive, batch.")
    ] = None,
    preemptible: Annotated[bool | None, typer.Option("--preemptible/--no-preemptible")] = None,
    port: Annotated[int | None, typer.Option("--port", help="The port a notebook or service listens on.")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", help="K=V (repeatable).")] = None,
    grace: Annotated[float | None, typer.Option("--grace", help="Seconds between SIGTERM and SIGKILL.")] = None,
    max_duration: Annotated[
        str | None, typer.Option("--max-duration", help="Stopped once it has run this long, e.g. 4h (and ETAs use it).")
    ] = None,
    idempotency_key: Annotated[str | None, typer.Option("--idempotency-key", help="Retry-safe submit.")] = None,
    output: Output = OutputOpt,
) -> None:
    """Submit a workload: `gpupool submit -p vision --gpus 2 -- python train.py`."""
    pairs: dict[str, str] = {}
    for item in env or []:
        key, sep, value = item.partition("=")
        if not sep:
            fail(f"--env {item!r}: expected KEY=VALUE", 2)
        pairs[key] = value
    with client() as c:
        fields: dict[str, Any] = {
            "project": _project(c, project), "name": name, "type": type_, "gpu": gpu, "gpus": gpus,
            "gpu_memory": gpu_memory, "workers": workers, "priority": priority, "preemptible": preemptible,
            "port": port, "env": pairs, "command": list(command or []), "grace_s": grace,
            "max_duration_s": None if max_duration is None else parse_duration(max_duration),
        }  # fmt: skip
        try:
            body = WorkloadCreate.model_validate(fields)
        except ValidationError as e:
            fail(_validation(e), 2)
        _submitted(c.submit(body, idempotency_key), output)


def apply(
    file: Annotated[Path, typer.Option("-f", "--file", help="A workload in YAML (the fields of submit).")],
    output: Output = OutputOpt,
) -> None:
    """Submit the workload described in a YAML file."""
    try:
        data = yaml.safe_load(file.read_text() if str(file) != "-" else sys.stdin.read())
    except OSError as e:
        fail(f"cannot read {file}: {e.strerror}", 2)
    except yaml.YAMLError as e:
        fail(f"{file} is not valid YAML: {str(e).splitlines()[0]}", 2)
    if not isinstance(data, dict):
        fail(f"{file}: expected a mapping of workload fields (project, name, type, gpus, command, ...)", 2)
    data = {str(k).replace("-", "_"): v for k, v in data.items()}
    if "max_duration" in data:  # a duration as submit takes it ("4h"); the API's field is in seconds
        declared = data.pop("max_duration")
        data["max_duration_s"] = parse_duration(str(declared)) if declared is not None else None
    # Not a field of the workload: the submit's retry key, sent as the Idempotency-Key header.
    key = data.pop("idempotency_key", None)
    if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= 128):
        fail(f"{file}: idempotency_key is a string of 1 to 128 characters", 2)
    with client() as c:
        if "project" not in data:
            data["project"] = _project(c, None)
        try:
            body = WorkloadCreate.model_validate(data)
        except ValidationError as e:
            fail(f"{file}: {_validation(e)}", 2)
        _submitted(c.submit(body, key), output)


def _age(since: float) -> str:
    s = max(0, int(time.time() - since))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


_BASIS = {
    "declared": "from declared max durations and minimum runtimes",
    "history": "from the runtimes of the project's finished work",
    "none": "nothing running is expected to end",
}


def _span(seconds: float) -> str:
    s = int(seconds)
    if s >= 86400:
        return f"{s // 86400}d{s % 86400 // 3600}h"
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{max(1, s // 60)}m"


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
    state: Annotated[str | None, typer.Option("--state", help="Only workloads in this state.")] = None,
    output: Output = OutputOpt,
) -> None:
    """List workloads you can see, newest first."""
    with client() as c:
        rows = c.list_workloads(project, state)
    if output is Output.json:
        emit_json(rows)
        return
    print_list(rows)


def print_list(rows: Sequence[WorkloadPublic]) -> None:
    """The table `list` prints: a queued workload's REASON is its blocker in a few words, a live one's its node."""
    print_table(
        None,
        ("NAME", "PROJECT", "TYPE", "PRIORITY", "STATE", "GPUS", "NODE/DEVICES", "REASON", "ETA", "AGE"),
        (
            (w.name, w.project, w.type, w.priority, w.state, w.gpu_request,
             f"{w.node}:{','.join(map(str, w.devices))}" if w.node else "-",
             w.reason_short if w.state in QUEUED else "-", eta_text(w), _age(w.created_at))
            for w in rows
        ),
    )  # fmt: skip


def describe_text(d: WorkloadDetail) -> None:
    """What `describe` prints."""
    fmt = "%Y-%m-%d %H:%M:%S"
    print(f"Name:        {d.name}  (id {d.id})")
    print(f"Project:     {d.project}")
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
        limits.append(f"{what} after {d.idle_timeout_s:g}s below {d.idle_threshold_pct}% GPU")
    if d.max_runtime_s is not None:
        limits.append(f"runs at most {d.max_runtime_s:g}s")
    if d.max_duration_s is not None:
        limits.append(f"declared max duration {duration(d.max_duration_s)}")
    if limits:
        idle = f"; idle for {time.time() - d.idle_since:.0f}s now" if d.idle_since and d.state == Phase.RUNNING else ""
        print(f"Policy:      {', '.join(limits)}{idle}")
    if d.command:
        print(f"Command:     {' '.join(d.command)}")
    if d.url:
        print(f"URL:         {d.url}")
    if d.exit_code is not None:
        print(f"Exit code:   {d.exit_code}")
    if d.isolation:
        print("Isolation:")
        for what, how in d.isolation.items():
            print(f"  {what + ':':<12} {how}")
    print("Events:")
    for e in d.events:
        print(f"  {time.strftime(fmt, time.localtime(e.at))}  {e.state:<10} {e.reason}{start_note(e)}")


def _wait(seconds: float) -> str:
    return f"{max(0, int(seconds))}s" if seconds < 60 else _span(seconds)


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
    """Everything about one workload, including why it is pending."""
    with client() as c:
        d = c.describe(name, project)
    emit_json(d) if output is Output.json else describe_text(d)


def logs(
    name: str,
    project: ProjectOpt = None,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep streaming until it ends.")] = False,
    rank: Annotated[int, typer.Option("--rank", help="Which gang member.")] = 0,
) -> None:
    """Print a workload's output; with -f, stream it as it is written until the workload ends."""
    out = sys.stdout.buffer
    with client() as c:
        if follow:
            for data in c.follow_logs(name, project, rank):
                out.write(data)
                out.flush()
            return
        data, _, _ = c.logs(name, project, rank, 0)
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
