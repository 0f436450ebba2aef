"""A decision written to the store (persist first), then carried out through the backend (idempotently)."""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Callable, Mapping, Sequence

from gpupool.backends.base import Backend, DeviceGrant, LaunchSpec, LaunchWaits
from gpupool.control import mlflow_runs
from gpupool.core import Decision
from gpupool.failpoints import failpoint
from gpupool.lifecycle import transitions as lifecycle
from gpupool.lifecycle.phases import LIVE, QUEUED, AllocPhase, PendingReason, Phase, StopReason
from gpupool.lifecycle.transitions import current
from gpupool.store.snapshot import row_id
from gpupool.store.tables import AllocationRow, EventRow, NodeRow, WorkloadRow

SERVES_PORT = ("notebook", "inference")
log = logging.getLogger("gpupool.control")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def persist(
    rows: dict[int, WorkloadRow], decision: Decision, now: float, causes: Mapping[str, Mapping[str, str]] | None = None
) -> list[EventRow]:
    """The decision on these rows. A workload without a row here is not the caller's to write this way: a queued
    one the scheduler keeps as columns (gpupool.control.view), or one written by someone else since the decision
    was made (it is read again, and decided again, next cycle). `causes`: each eviction's typed arguments, by the
    core's id of its victim (gpupool.control.causes), recorded with its stop beside the core's sentence."""
    events: list[EventRow] = []
    for bind in decision.binds:
        row = rows.get(row_id(bind.workload))
        if row is None:
            continue
        master = free_port() if row.workers > 1 else None
        for p in bind.placements:
            port = (row.port or free_port()) if row.type in SERVES_PORT and p.member == 0 else None
            row.allocations.append(
                AllocationRow(
                    id=f"{row.id}-{row.attempt}-{p.member}",
                    workload_id=row.id,
                    attempt=row.attempt,
                    member=p.member,
                    node=p.node,
                    devices=[{"index": d.index, "milli": d.milli, "memory_mib": d.memory_mib} for d in p.devices],
                    state=AllocPhase.BOUND.value,
                    port=port,
                    master_port=master,
                    created_at=now,
                )
            )
        events.append(lifecycle.placed(row, [p.node for p in bind.placements], now))
    for ev in decision.evictions:
        victim = rows.get(row_id(ev.workload))
        stopped = (
            None
            if victim is None
            else lifecycle.request_stop(
                victim, StopReason(ev.reason.value), now, detail=ev.message, **(causes or {}).get(ev.workload, {})
            )
        )
        if stopped is not None:
            events.append(stopped)
    stopping = {ev.workload for ev in decision.evictions}
    for pend in decision.pending:
        row = rows.get(row_id(pend.workload))
        if row is None:
            continue
        nominated = sorted({x.node for x in pend.nominated})
        # A workload moved to make room is stopped and nominated elsewhere in one decision: its reason stays
        # the eviction's until it has stopped; the nomination is kept for its restart.
        if pend.workload not in stopping and row.state in QUEUED:
            lifecycle.waiting(row, PendingReason(pend.code.value), pend.message, pend.args)
        if row.nominated != nominated:
            row.nominated = nominated
    return events


def app_path(project: str, name: str) -> str:
    """The stable path of a workload's app on the server: it survives suspend, resume and requeue."""
    return f"/apps/{project}/{name}/"


def notebook_argv(socket_path: str, base_url: str) -> tuple[str, ...]:
    """JupyterLab on a Unix socket only the server reaches, under its proxy path. Its token (from the
    environment, never a command line) is known to the server alone: the proxy adds it to every request it has
    authenticated, so Jupyter's own checks (XSRF included) see a token-authenticated client."""
    argv = (
        sys.executable, "-m", "jupyterlab", "--no-browser", f"--ServerApp.sock={socket_path}",
        "--ServerApp.sock_mode=0600", f"--ServerApp.base_url={base_url}",
        "--ServerApp.root_dir=.", "--ServerApp.allow_remote_access=True", "--ServerApp.trust_xheaders=True",
    )  # fmt: skip
    # A server run as root in single-user mode runs its notebooks as root too; Jupyter wants that said out loud.
    return (*argv, "--allow-root") if os.geteuid() == 0 else argv


def launch_spec(
    row: WorkloadRow,
    alloc: AllocationRow,
    project: str,
    node: NodeRow | None,
    app_socket: Callable[[str], str] | None = None,
    secrets: dict[str, str] | None = None,
    pod_security: str = "restricted",
    mlflow: str = "mlflow",
) -> LaunchSpec:
    models = {int(d["index"]): d for d in (node.devices if node else [])}
    grants = tuple(
        DeviceGrant(
            int(d["index"]),
            int(d["milli"]),
            int(d["memory_mib"]),
            str(models.get(int(d["index"]), {}).get("model", "")),
            int(models.get(int(d["index"]), {}).get("memory_mib", 0)),
        )
        for d in alloc.devices
    )
    env = {str(k): str(v) for k, v in row.env.items()}
    argv: tuple[str, ...] = tuple(row.command)
    init: tuple[str, ...] = ()
    if row.mlflow and row.mlflow.get("model"):
        init, argv = mlflow_runs.serving(mlflow, str(row.mlflow["model"]))
    if row.type == "notebook" and app_socket is not None:
        argv = notebook_argv(app_socket(alloc.id), app_path(project, row.name))
        env["JUPYTER_TOKEN"] = row.app_token or ""
        env["JUPYTER_RUNTIME_DIR"] = ".jupyter/runtime"
    return LaunchSpec(
        alloc_id=alloc.id,
        workload_id=row.id,
        workload_name=row.name,
        project=project,
        kind=row.type,
        argv=argv,
        env=env,
        init=init,
        devices=grants,
        rank=alloc.member,
        world_size=row.workers,
        master_port=alloc.master_port,
        port=alloc.port,
        node=alloc.node,
        attempt=alloc.attempt,
        adopted=row.origin is not None,
        image=row.image,
        code=row.code,
        grace_s=row.grace_s,
        cpu_milli=row.cpu_milli,
        memory_mib=row.memory_mib,
        project_id=row.project_id,
        pod_security=pod_security,
        secrets=dict(secrets or {}),
    )


Launcher = Callable[[Callable[[LaunchSpec], None], list[LaunchSpec]], list[BaseException | None]]


def sequential(launch: Callable[[LaunchSpec], None], specs: list[LaunchSpec]) -> list[BaseException | None]:
    out: list[BaseException | None] = []
    for spec in specs:
        try:
            launch(spec)
            out.append(None)
        except Exception as e:  # reported per launch; the others still go
            out.append(e)
    return out


def act(
    rows: Sequence[WorkloadRow],
    projects: dict[int, str],
    nodes: dict[str, NodeRow],
    backend: Backend,
    now: float,
    launcher: Launcher = sequential,
    secrets: Callable[[int], dict[str, str]] | None = None,
    pod_security: dict[int, str] | None = None,
    own: Callable[[WorkloadRow], dict[str, str]] | None = None,
    mlflow: str = "mlflow",
) -> tuple[list[EventRow], bool]:
    """Launch what is bound, signal what is stopping, promote what answers. `own(row)`: what each launch is
    given to call the API as its workload (gpupool.store.workload_tokens). Returns events and whether
    something is in flight (the loop then looks again soon). Launches may run in parallel (a remote backend
    spends its time waiting on the network); one that fails stays bound and is tried again next cycle."""
    events: list[EventRow] = []
    busy = False
    pending: list[tuple[AllocationRow, LaunchSpec]] = []
    app_socket: Callable[[str], str] | None = getattr(backend, "app_socket", None)
    for row in rows:
        if row.state not in LIVE:
            continue
        for alloc in current(row):
            if alloc.state == AllocPhase.BOUND and row.stop_reason is None:
                env = secrets(row.project_id) if secrets is not None else None
                if own is not None:  # the workload's own API token and where to call: a secret too
                    env = {**(env or {}), **own(row)}
                level = (pod_security or {}).get(row.project_id, "restricted")
                node = nodes.get(alloc.node)
                spec = launch_spec(row, alloc, projects[row.project_id], node, app_socket, env, level, mlflow)
                pending.append((alloc, spec))
            elif alloc.state == AllocPhase.BOUND:
                lifecycle.move_alloc(alloc, AllocPhase.ENDED)  # stopped before it ever started
    for (alloc, spec), error in zip(pending, launcher(backend.launch, [s for _, s in pending]), strict=True):
        if error is None:
            lifecycle.move_alloc(alloc, AllocPhase.LAUNCHED)
        elif isinstance(error, LaunchWaits):
            log.debug("launching %s waits: %s", spec.alloc_id, error)
            busy = True
        else:
            log.warning("launching %s failed; trying again next cycle: %s", spec.alloc_id, error)
            busy = True
    for row in rows:
        if row.state not in LIVE:
            continue
        allocs = current(row)
        for alloc in allocs:
            if alloc.stop_at is not None and alloc.state != AllocPhase.ENDED:
                backend.stop(alloc.id, force=now - alloc.stop_at >= row.grace_s)
                failpoint("reclaim.during")
                busy = True
        if row.state == Phase.STARTING and row.stop_reason is None:
            if any(a.state == AllocPhase.BOUND for a in allocs):
                busy = True  # a launch failed; it is tried again next cycle
                continue
            if row.type in SERVES_PORT and not all(backend.healthy(a.id, a.port) for a in allocs):
                busy = True
                continue
            events.append(lifecycle.started(row, row.type in SERVES_PORT, now))
    return events, busy
