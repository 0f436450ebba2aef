"""/metrics in Prometheus's format, computed at scrape time from the store and the loop's last sample.

Device metrics use the DCGM exporter's names and labels, so dashboards built for it work unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpupool.control.controller import Controller
from gpupool.lifecycle.events import EventCode
from gpupool.lifecycle.phases import EVICTIONS, QUEUED
from gpupool.store.holdings import by_device, by_project, holdings
from gpupool.store.tables import EventRow, NodeRow, QueueRow, UsageRow, WorkloadRow

_DCGM = ["gpu", "UUID", "Hostname", "modelName"]


def render(
    session: Session, controller: Controller, visible: Callable[[int], bool] = lambda _: True
) -> tuple[bytes, str]:
    """Everything for admins and the scrape token; a non-admin's series name only the projects it may read
    (devices' allocation and activity carry no tenant)."""
    reg = CollectorRegistry()
    g = _Gauges(reg)
    names = {q.id: q.name for q in session.scalars(select(QueueRow))}
    projects = {q.id: q for q in session.scalars(select(QueueRow).where(QueueRow.kind == "project")) if visible(q.id)}

    held = holdings(session)
    used, per_project = by_device(held), by_project(held)
    for n in session.scalars(select(NodeRow)):
        for d in n.devices:
            ratio = used.get((n.name, int(d["index"])), 0) / 1000
            g.device_allocated.labels(n.name, str(d["index"]), str(d["model"])).set(ratio)
    sample = controller.last_sample
    for dev in sample.devices if sample else ():
        labels = (str(dev.index), dev.uuid, dev.node, dev.model)
        g.dcgm_util.labels(*labels).set(dev.util_pct)
        g.dcgm_fb_used.labels(*labels).set(dev.memory_used_mib)
    for pid, q in projects.items():
        g.project_allocated.labels(q.name).set(per_project.get(pid, 0) / 1000)
        for quota in q.quotas:
            g.project_deserved.labels(q.name, quota.pool).set(quota.deserved_milli / 1000)
            if quota.limit_milli is not None:
                g.project_limit.labels(q.name, quota.pool).set(quota.limit_milli / 1000)
        g.queue_depth.labels(q.name).set(0)
        g.oldest_pending.labels(q.name).set(0)
    decision = controller.last_decision
    shown = {q.name for q in projects.values()}
    sees_all = all(visible(pid) for pid in names)
    for share in decision.shares if decision else ():
        if sees_all or share.queue in shown:
            g.fair_share.labels(share.queue, share.pool).set(share.fair_share / 1000)
    now = time.time()
    waiting = session.execute(
        select(WorkloadRow.project_id, func.count(), func.min(WorkloadRow.queued_at))
        .where(WorkloadRow.state.in_(sorted(QUEUED)), WorkloadRow.hold.is_(False))
        .group_by(WorkloadRow.project_id)
    )
    for project_id, count, oldest in waiting:
        if project_id in projects:
            g.queue_depth.labels(names[project_id]).set(count)
            g.oldest_pending.labels(names[project_id]).set(max(0.0, now - oldest))
    mine = sorted(projects)
    for state, count in session.execute(
        select(WorkloadRow.state, func.count()).where(WorkloadRow.project_id.in_(mine)).group_by(WorkloadRow.state)
    ):
        g.states.labels(state).set(count)
    stops: dict[str, int] = {r.value: 0 for r in sorted(EVICTIONS)}
    for code, count in session.execute(
        select(EventRow.reason_code, func.count())
        .join(WorkloadRow, EventRow.workload_id == WorkloadRow.id)
        .where(EventRow.code == EventCode.STOP_REQUESTED, EventRow.reason_code.in_(sorted(EVICTIONS)))
        .where(WorkloadRow.project_id.in_(mine))
        .group_by(EventRow.reason_code)
    ):
        stops[str(code)] = int(count)
    for code, count in stops.items():
        g.evictions.labels(code).inc(count)
    usage = session.execute(
        select(WorkloadRow.project_id, func.sum(UsageRow.milli_seconds), func.sum(UsageRow.busy_milli_seconds))
        .join(WorkloadRow, UsageRow.workload_id == WorkloadRow.id)
        .group_by(WorkloadRow.project_id)
    )
    for project_id, allocated, busy in usage:
        if project_id not in projects:
            continue
        g.allocated_seconds.labels(names[project_id]).inc((allocated or 0) / 1000)
        g.idle_seconds.labels(names[project_id]).inc(max(0.0, (allocated or 0) - (busy or 0)) / 1000)
    g.cycle.set(controller.last_cycle_s)
    g.cycles.set(controller.cycles)
    return generate_latest(reg), CONTENT_TYPE_LATEST


class _Gauges:
    def __init__(self, reg: CollectorRegistry) -> None:
        self.dcgm_util = Gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", _DCGM, registry=reg)
        self.dcgm_fb_used = Gauge("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", _DCGM, registry=reg)
        self.device_allocated = Gauge(
            "gpupool_device_allocated_ratio",
            "Share of a GPU allocated (0-1).",
            ["node", "device", "model"],
            registry=reg,
        )
        self.project_allocated = Gauge(
            "gpupool_project_allocated_gpus", "GPUs allocated to a project now.", ["project"], registry=reg
        )
        self.project_deserved = Gauge(
            "gpupool_project_deserved_gpus", "GPUs a project is guaranteed.", ["project", "pool"], registry=reg
        )
        self.project_limit = Gauge(
            "gpupool_project_limit_gpus", "A project's hard cap on GPUs.", ["project", "pool"], registry=reg
        )
        self.fair_share = Gauge(
            "gpupool_queue_fair_share_gpus", "Fair share of a department or project in the last cycle.",
            ["queue", "pool"], registry=reg,
        )  # fmt: skip
        self.queue_depth = Gauge("gpupool_queue_depth", "Workloads waiting to start.", ["project"], registry=reg)
        self.oldest_pending = Gauge(
            "gpupool_pending_oldest_age_seconds", "Age of the oldest waiting workload.", ["project"], registry=reg
        )
        self.states = Gauge("gpupool_workloads", "Workloads by state.", ["state"], registry=reg)
        self.evictions = Counter(
            "gpupool_evictions", "Workloads stopped by the scheduler or a policy, by reason.", ["reason"], registry=reg
        )
        self.allocated_seconds = Counter(
            "gpupool_allocated_gpu_seconds", "GPU-seconds allocated, by project.", ["project"], registry=reg
        )
        self.idle_seconds = Counter(
            "gpupool_idle_allocated_gpu_seconds",
            "GPU-seconds allocated but idle, by project.",
            ["project"],
            registry=reg,
        )
        self.cycle = Gauge("gpupool_scheduler_cycle_seconds", "Duration of the last scheduling cycle.", registry=reg)
        self.cycles = Gauge("gpupool_scheduler_cycles", "Scheduling cycles run since start.", registry=reg)
