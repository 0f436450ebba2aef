"""/metrics in Prometheus's format, computed at scrape time from the store and the loop's last sample.

One custom collector answers a scrape: it is made for the request with the caller's visibility (a non-admin sees
only the projects it may read) and yields metric families, plain values built from one read of the store; nothing
is registered and no metric object outlives the scrape. What lives longer (the per-step durations of scheduling
cycles) is a histogram the controller owns, which the collector passes on as it is.

Device metrics use the DCGM exporter's names and labels, so dashboards built for it work unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
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
    return generate_latest(ScrapeCollector(session, controller, visible)), CONTENT_TYPE_LATEST


class ScrapeCollector(Collector):
    """The metrics one caller may see, read from the store when collected."""

    def __init__(self, session: Session, controller: Controller, visible: Callable[[int], bool]) -> None:
        self.session = session
        self.controller = controller
        self.visible = visible

    def collect(self) -> Iterator[Metric]:
        s = self.session
        names = {q.id: q.name for q in s.scalars(select(QueueRow))}
        projects = {
            q.id: q for q in s.scalars(select(QueueRow).where(QueueRow.kind == "project")) if self.visible(q.id)
        }
        held = holdings(s)
        yield from self._devices(by_device(held))
        yield from self._projects(projects, by_project(held))
        yield from self._fair_shares(projects, all(self.visible(pid) for pid in names))
        yield from self._waiting(projects)
        yield from self._workloads(sorted(projects))
        yield from self._usage(projects)
        yield GaugeMetricFamily(
            "gpupool_scheduler_cycle_seconds", "Duration of the last scheduling cycle.", self.controller.last_cycle_s
        )
        yield GaugeMetricFamily(
            "gpupool_scheduler_cycles", "Scheduling cycles run since start.", self.controller.cycles
        )
        yield from self.controller.step_seconds.collect()

    def _devices(self, used: dict[tuple[str, int], int]) -> Iterator[Metric]:
        util = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", labels=_DCGM)
        fb_used = GaugeMetricFamily("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", labels=_DCGM)
        sample = self.controller.last_sample
        for dev in sample.devices if sample else ():
            labels = [str(dev.index), dev.uuid, dev.node, dev.model]
            util.add_metric(labels, dev.util_pct)
            fb_used.add_metric(labels, dev.memory_used_mib)
        allocated = GaugeMetricFamily(
            "gpupool_device_allocated_ratio", "Share of a GPU allocated (0-1).", labels=["node", "device", "model"]
        )
        for n in self.session.scalars(select(NodeRow)):
            for d in n.devices:
                ratio = used.get((n.name, int(d["index"])), 0) / 1000
                allocated.add_metric([n.name, str(d["index"]), str(d["model"])], ratio)
        return iter((util, fb_used, allocated))

    def _projects(self, projects: dict[int, QueueRow], per_project: dict[int, int]) -> Iterator[Metric]:
        allocated = GaugeMetricFamily(
            "gpupool_project_allocated_gpus", "GPUs allocated to a project now.", labels=["project"]
        )
        deserved = GaugeMetricFamily(
            "gpupool_project_deserved_gpus", "GPUs a project is guaranteed.", labels=["project", "pool"]
        )
        limit = GaugeMetricFamily(
            "gpupool_project_limit_gpus", "A project's hard cap on GPUs.", labels=["project", "pool"]
        )
        for pid, q in projects.items():
            allocated.add_metric([q.name], per_project.get(pid, 0) / 1000)
            for quota in q.quotas:
                deserved.add_metric([q.name, quota.pool], quota.deserved_milli / 1000)
                if quota.limit_milli is not None:
                    limit.add_metric([q.name, quota.pool], quota.limit_milli / 1000)
        return iter((allocated, deserved, limit))

    def _fair_shares(self, projects: dict[int, QueueRow], sees_all: bool) -> Iterator[Metric]:
        """Departments' shares only for a caller who sees every tenant (a department's share tells of its
        other projects)."""
        shares = GaugeMetricFamily(
            "gpupool_queue_fair_share_gpus",
            "Fair share of a department or project in the last cycle.",
            labels=["queue", "pool"],
        )
        shown = {q.name for q in projects.values()}
        decision = self.controller.last_decision
        for share in decision.shares if decision else ():
            if sees_all or share.queue in shown:
                shares.add_metric([share.queue, share.pool], share.fair_share / 1000)
        yield shares

    def _waiting(self, projects: dict[int, QueueRow]) -> Iterator[Metric]:
        depth = {pid: 0.0 for pid in projects}
        oldest = {pid: 0.0 for pid in projects}
        now = time.time()
        for project_id, count, first in self.session.execute(
            select(WorkloadRow.project_id, func.count(), func.min(WorkloadRow.queued_at))
            .where(WorkloadRow.state.in_(sorted(QUEUED)), WorkloadRow.hold.is_(False))
            .where(WorkloadRow.project_id.in_(sorted(projects)))
            .group_by(WorkloadRow.project_id)
        ):
            depth[project_id], oldest[project_id] = count, max(0.0, now - first)
        queue_depth = GaugeMetricFamily("gpupool_queue_depth", "Workloads waiting to start.", labels=["project"])
        oldest_age = GaugeMetricFamily(
            "gpupool_pending_oldest_age_seconds", "Age of the oldest waiting workload.", labels=["project"]
        )
        for pid, q in projects.items():
            queue_depth.add_metric([q.name], depth[pid])
            oldest_age.add_metric([q.name], oldest[pid])
        return iter((queue_depth, oldest_age))

    def _workloads(self, mine: list[int]) -> Iterator[Metric]:
        states = GaugeMetricFamily("gpupool_workloads", "Workloads by state.", labels=["state"])
        for state, count in self.session.execute(
            select(WorkloadRow.state, func.count()).where(WorkloadRow.project_id.in_(mine)).group_by(WorkloadRow.state)
        ):
            states.add_metric([state], count)
        # Counted from the events: every stop by the scheduler or a policy, by its reason code.
        stops: dict[str, float] = {r.value: 0 for r in sorted(EVICTIONS)}
        for code, count in self.session.execute(
            select(EventRow.reason_code, func.count())
            .join(WorkloadRow, EventRow.workload_id == WorkloadRow.id)
            .where(EventRow.code == EventCode.STOP_REQUESTED, EventRow.reason_code.in_(sorted(EVICTIONS)))
            .where(WorkloadRow.project_id.in_(mine))
            .group_by(EventRow.reason_code)
        ):
            stops[str(code)] = int(count)
        evictions = CounterMetricFamily(
            "gpupool_evictions", "Workloads stopped by the scheduler or a policy, by reason.", labels=["reason"]
        )
        for reason, stopped in stops.items():
            evictions.add_metric([reason], stopped)
        return iter((states, evictions))

    def _usage(self, projects: dict[int, QueueRow]) -> Iterator[Metric]:
        allocated = CounterMetricFamily(
            "gpupool_allocated_gpu_seconds", "GPU-seconds allocated, by project.", labels=["project"]
        )
        idle = CounterMetricFamily(
            "gpupool_idle_allocated_gpu_seconds", "GPU-seconds allocated but idle, by project.", labels=["project"]
        )
        for project_id, milli_s, busy in self.session.execute(
            select(WorkloadRow.project_id, func.sum(UsageRow.milli_seconds), func.sum(UsageRow.busy_milli_seconds))
            .join(WorkloadRow, UsageRow.workload_id == WorkloadRow.id)
            .where(WorkloadRow.project_id.in_(sorted(projects)))
            .group_by(WorkloadRow.project_id)
        ):
            allocated.add_metric([projects[project_id].name], (milli_s or 0) / 1000)
            idle.add_metric([projects[project_id].name], max(0.0, (milli_s or 0) - (busy or 0)) / 1000)
        return iter((allocated, idle))
