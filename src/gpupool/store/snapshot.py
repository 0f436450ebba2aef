"""Rows to the core's snapshot: the only translation between what is stored and what the scheduler reads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, select
from sqlalchemy.orm import Session

from gpupool.core import (
    Device,
    DeviceShare,
    Node,
    Placement,
    PoolSettings,
    Queue,
    Quota,
    Request,
    Snapshot,
    State,
    Workload,
)
from gpupool.lifecycle.phases import LIVE
from gpupool.store.tables import NodeRow, PoolRow, QueueRow, WorkloadRow


def core_id(workload_id: int) -> str:
    """Zero-padded, so the core's tie-breaks by id follow submission order."""
    return f"w{workload_id:010d}"


def row_id(core: str) -> int:
    return int(core[1:])


def core_node(row: NodeRow) -> Node:
    devices = tuple(Device(int(d["index"]), str(d["model"]), int(d["memory_mib"])) for d in row.devices)
    return Node(row.name, row.pool, row.cpu_milli, row.memory_mib, devices, row.schedulable, row.cluster or "")


def core_nodes(session: Session) -> tuple[Node, ...]:
    return tuple(core_node(n) for n in session.scalars(select(NodeRow).order_by(NodeRow.name)))


def core_pools(session: Session) -> dict[str, PoolSettings]:
    """What admins set per pool; a pool without a row takes the core's defaults."""
    return {
        r.name: PoolSettings(share_across_projects=r.share_across_projects)
        for r in session.scalars(select(PoolRow).order_by(PoolRow.name))
    }


def core_queues(session: Session) -> tuple[Queue, ...]:
    rows = session.scalars(select(QueueRow).order_by(QueueRow.name)).all()
    names = {r.id: r.name for r in rows}
    return tuple(
        Queue(
            r.name,
            names.get(r.parent_id) if r.parent_id is not None else None,
            {q.pool: Quota(q.deserved_milli, q.limit_milli, q.weight) for q in r.quotas},
            r.strict_fifo,
        )
        for r in rows
    )


def core_workload(row: WorkloadRow | Row[Any], project: str) -> Workload:
    """A row, or the columns of a queued one (gpupool.store.changes.QUEUED_COLUMNS: it has no allocations)."""
    if row.state in LIVE:
        state = State.RELEASING if row.stop_reason else State.RUNNING
        # Members that already ended well keep their place: a gang finishing rank by rank is not broken.
        placements = tuple(
            Placement(
                a.member,
                a.node,
                tuple(DeviceShare(int(d["index"]), int(d["milli"]), int(d["memory_mib"])) for d in a.devices),
            )
            for a in row.allocations
            if a.attempt == row.attempt
        )
    else:
        state, placements = State.PENDING, ()
    return Workload(
        id=core_id(row.id),
        project=project,
        request=Request(row.gpus, row.gpu_milli, row.gpu_memory_mib, row.cpu_milli, row.memory_mib),
        priority=row.priority,
        priority_class=row.priority_class,
        preemptible=row.preemptible,
        min_runtime_s=row.min_runtime_s,
        gang_size=row.workers,
        pools=tuple(row.pools),
        gpu_models=tuple(row.gpu_models or ()),
        clusters=tuple(row.clusters or ()),
        submit_time=row.queued_at,
        state=state,
        placements=placements,
        start_time=row.started_at,
        nominated_nodes=tuple(row.nominated),
        label=f"'{row.name}'",
    )


def build_snapshot(session: Session, workloads: Sequence[Workload], now: float) -> Snapshot:
    """The store's nodes, queues and pools, with the workloads the caller keeps (gpupool.control.view)."""
    return Snapshot(core_nodes(session), core_queues(session), tuple(workloads), now, pool_settings=core_pools(session))
