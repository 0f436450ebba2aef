"""/metrics in Prometheus's format, computed from the store at scrape time."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpupool.control.controller import Controller
from gpupool.store.tables import AllocationRow, NodeRow, QueueRow, WorkloadRow


def render(session: Session, controller: Controller) -> tuple[bytes, str]:
    reg = CollectorRegistry()
    device = Gauge(
        "gpupool_device_allocated_ratio", "Share of a GPU allocated (0..1)", ["node", "device", "model"], registry=reg
    )
    project = Gauge("gpupool_project_allocated_gpus", "GPUs allocated to a project", ["project"], registry=reg)
    deserved = Gauge("gpupool_project_deserved_gpus", "GPUs a project is guaranteed", ["project", "pool"], registry=reg)
    depth = Gauge("gpupool_queue_depth", "Workloads waiting to start", ["project"], registry=reg)
    states = Gauge("gpupool_workloads", "Workloads by state", ["state"], registry=reg)
    cycle = Gauge("gpupool_scheduler_cycle_seconds", "Duration of the last scheduling cycle", registry=reg)
    cycles = Gauge("gpupool_scheduler_cycles", "Scheduling cycles run since start", registry=reg)

    names = {q.id: q.name for q in session.scalars(select(QueueRow))}
    used: dict[tuple[str, int], int] = {}
    per_project: dict[str, int] = {n: 0 for i, n in names.items()}
    rows = session.execute(
        select(AllocationRow.node, AllocationRow.devices, WorkloadRow.project_id)
        .join(WorkloadRow, AllocationRow.workload_id == WorkloadRow.id)
        .where(AllocationRow.state != "ended")
    )
    for node, devices, project_id in rows:
        for d in devices:
            used[(node, int(d["index"]))] = used.get((node, int(d["index"])), 0) + int(d["milli"])
            per_project[names[project_id]] = per_project.get(names[project_id], 0) + int(d["milli"])
    for n in session.scalars(select(NodeRow)):
        for d in n.devices:
            device.labels(n.name, str(d["index"]), str(d["model"])).set(used.get((n.name, int(d["index"])), 0) / 1000)
    for q in session.scalars(select(QueueRow).where(QueueRow.kind == "project")):
        project.labels(q.name).set(per_project.get(q.name, 0) / 1000)
        for quota in q.quotas:
            deserved.labels(q.name, quota.pool).set(quota.deserved_milli / 1000)
        depth.labels(q.name).set(0)
    waiting = session.execute(
        select(WorkloadRow.project_id, func.count())
        .where(WorkloadRow.state.in_(("pending", "preempted", "suspended")))
        .group_by(WorkloadRow.project_id)
    )
    for project_id, count in waiting:
        depth.labels(names[project_id]).set(count)
    for state, count in session.execute(select(WorkloadRow.state, func.count()).group_by(WorkloadRow.state)):
        states.labels(state).set(count)
    cycle.set(controller.last_cycle_s)
    cycles.set(controller.cycles)
    return generate_latest(reg), CONTENT_TYPE_LATEST
