"""Rows to wire models."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from gpupool.control.mlflow_runs import run_url
from gpupool.control.policies import Policy
from gpupool.core import MILLI
from gpupool.lifecycle.events import render
from gpupool.lifecycle.phases import LIVE, QUEUED, STARTED, TERMINAL, AllocPhase
from gpupool.models.clusters import CLUSTER_LOST_AFTER_S, ClusterLostPolicyPublic
from gpupool.models.rightsizing import RightsizingAdvice
from gpupool.models.schemas import (
    AllocationPublic,
    DevicePublic,
    EventPublic,
    QueuePosition,
    WorkloadDetail,
    WorkloadOrigin,
    WorkloadPublic,
)
from gpupool.services import reasons
from gpupool.services.volumes import mounts_of
from gpupool.store.tables import AllocationRow, EventRow, WorkloadRow


def gpu_request(row: WorkloadRow) -> str:
    if row.gpus:
        one = f"{row.gpus} GPU" + ("s" if row.gpus > 1 else "")
    elif row.gpu_milli:
        one = f"{row.gpu_milli / MILLI:g} GPU"
    elif row.gpu_memory_mib:
        one = f"{row.gpu_memory_mib / 1024:g}GiB GPU memory"
    else:
        one = "no GPU"
    return f"{row.workers} × {one}" if row.workers > 1 else one


def live(row: WorkloadRow) -> list[AllocationRow]:
    return [a for a in row.allocations if a.state != AllocPhase.ENDED and a.attempt == row.attempt]


_BASES = frozenset({"declared", "history", "none"})


def workload_public(row: WorkloadRow, project: str, owner: str = "") -> WorkloadPublic:
    allocs = live(row)
    waiting = row.state in QUEUED and not row.hold
    args, detail = reasons.of_row(row)
    if detail is not None:
        reason, short = reasons.sentence(row.reason_code, args, detail), reasons.short(row.reason_code, args)
    else:
        reason = short = render(row.reason_event, row.reason_code, row.reason_args)
    suspension = reasons.suspension(row)
    if suspension is not None and reasons.tells_suspension(row, suspension):
        reason, short = suspension.notice, reasons.suspension_short(row)
    return WorkloadPublic(
        id=row.id,
        name=row.name,
        project=project,
        owner=owner,
        type=row.type,
        priority=row.priority_class,
        preemptible=row.preemptible,
        state=row.state,
        reason=reason,
        reason_event=row.reason_event,
        reason_code=row.reason_code,
        reason_args=args,
        reason_short=short,
        node=allocs[0].node if allocs else None,
        devices=sorted({int(d["index"]) for a in allocs for d in a.devices}),
        gpu_request=gpu_request(row),
        gpus=row.gpus,
        gpu_milli=row.gpu_milli,
        gpu_memory_mib=row.gpu_memory_mib,
        workers=row.workers,
        attempt=row.attempt,
        exit_code=row.exit_code,
        gpu_util_pct=row.gpu_util_pct if row.state in LIVE else None,
        max_duration_s=row.max_duration_s,
        eta=datetime.fromtimestamp(row.eta, UTC) if row.eta is not None and waiting else None,
        eta_basis=row.eta_basis if waiting and row.eta_basis in _BASES else None,
        suspension=suspension,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
    )


def workload_detail(
    row: WorkloadRow,
    project: str,
    events: Sequence[EventRow],
    policy: Policy,
    *,
    public_url: str,
    isolation: dict[str, str],
    position: QueuePosition | None = None,
    rightsizing: RightsizingAdvice | None = None,
    owner: str = "",
) -> WorkloadDetail:
    base = workload_public(row, project, owner).model_dump()
    allocs = live(row)
    url = None
    if row.type in ("notebook", "inference") and row.state not in TERMINAL:
        # Stable through suspend, resume and requeue; the proxy says 503 while it does not run.
        url = f"{public_url.rstrip('/')}/apps/{project}/{row.name}/"
    fraction = None
    if row.gpu_milli or row.gpu_memory_mib:
        enforced = bool(allocs) and all(a.state in STARTED and a.enforced for a in allocs)
        fraction = "enforced" if enforced else "advisory"
    return WorkloadDetail(
        **base,
        command=list(row.command),
        cpu_milli=row.cpu_milli,
        memory_mib=row.memory_mib,
        pools=list(row.pools),
        gpu_models=list(row.gpu_models or ()),
        clusters=list(row.clusters or ()),
        on_cluster_lost=(
            ClusterLostPolicyPublic(action="wait", after_s=CLUSTER_LOST_AFTER_S)
            if row.cluster_lost_after_s is None
            else ClusterLostPolicyPublic(action="requeue", after_s=row.cluster_lost_after_s)
        ),
        image=row.image,
        volumes=mounts_of(row.spec),
        env=dict(row.env),
        port=row.port,
        grace_s=row.grace_s,
        fraction=fraction,
        url=url,
        isolation=isolation,
        allocations=[
            AllocationPublic(
                member=a.member,
                node=a.node,
                devices=[DevicePublic(**d) for d in a.devices],
                state=a.state,
                port=a.port,
            )
            for a in allocs
        ],
        events=[
            EventPublic(
                at=e.at,
                state=e.state,
                code=e.code,
                reason_code=e.reason_code,
                args=dict(e.args or {}),
                reason=render(e.code, e.reason_code, e.args),
            )
            for e in events
        ],
        gpu_memory_used_mib=row.gpu_memory_used_mib if row.state in LIVE else None,
        idle_since=row.idle_since,
        idle_timeout_s=policy.idle_timeout_s.get(row.type),
        max_runtime_s=policy.max_runtime_s.get(row.type),
        idle_threshold_pct=policy.idle_threshold_pct,
        position=position,
        rightsizing=rightsizing,
        origin=WorkloadOrigin.model_validate(row.origin) if row.origin else None,
        mlflow_run_url=run_url(row.mlflow),
        model=(row.mlflow or {}).get("model"),
    )
