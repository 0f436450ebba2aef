"""Fluent builders so scenario tests read like the cluster they describe."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from gpupool.core import (
    MILLI,
    Decision,
    Device,
    DeviceShare,
    Node,
    Placement,
    PoolSettings,
    Queue,
    Quota,
    Request,
    SchedulerConfig,
    Snapshot,
    State,
    Workload,
    schedule,
)
from gpupool.core.priority import class_named
from gpupool.sim.apply import apply_decision


def milli(gpus: float | None) -> int | None:
    return None if gpus is None else round(gpus * MILLI)


class Cluster:
    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.pool_settings: dict[str, PoolSettings] = {}
        self.queues: dict[str, Queue] = {}
        self.workloads: list[Workload] = []
        self.now = 1000.0

    # -- hardware ------------------------------------------------------------------------------------

    def pool(
        self,
        name: str,
        nodes: int = 1,
        gpus: int = 8,
        model: str = "H100",
        gpu_memory_gib: int = 80,
        cpus: int = 64,
        memory_gib: int = 512,
        share_across_projects: bool = False,
        cluster: str = "",
        schedulable: bool = True,
    ) -> Cluster:
        """Nodes named pool-i, or cluster-pool-i in a named cluster (a hub's snapshot holds several)."""
        self.pool_settings[name] = PoolSettings(share_across_projects=share_across_projects)
        start = sum(1 for n in self.nodes if n.pool == name and n.cluster == cluster)
        prefix = f"{cluster}-{name}" if cluster else name
        for i in range(start, start + nodes):
            devices = tuple(Device(d, model, gpu_memory_gib * 1024) for d in range(gpus))
            self.nodes.append(
                Node(f"{prefix}-{i}", name, cpus * 1000, memory_gib * 1024, devices, schedulable, cluster)
            )
        return self

    # -- organisation --------------------------------------------------------------------------------

    def department(
        self, name: str, deserved: float = 0, limit: float | None = None, weight: int = 1, pool: str = ""
    ) -> Cluster:
        return self._queue(name, None, deserved, limit, weight, pool, False)

    def project(
        self,
        name: str,
        department: str | None = None,
        deserved: float = 0,
        limit: float | None = None,
        weight: int = 1,
        pool: str = "",
        strict_fifo: bool = False,
        **host: int,
    ) -> Cluster:
        """`host` takes CPU and memory quotas as Quota spells them: cpu_limit=8000, memory_deserved=..."""
        return self._queue(name, department, deserved, limit, weight, pool, strict_fifo, **host)

    def _queue(
        self,
        name: str,
        parent: str | None,
        deserved: float,
        limit: float | None,
        weight: int,
        pool: str,
        fifo: bool,
        **host: int,
    ) -> Cluster:
        pools = [pool] if pool else sorted({n.pool for n in self.nodes}) or ["default"]
        quota = Quota(deserved=milli(deserved) or 0, limit=milli(limit), over_quota_weight=weight, **host)
        self.queues[name] = Queue(name, parent, {p: quota for p in pools}, strict_fifo=fifo)
        return self

    # -- work ----------------------------------------------------------------------------------------

    def submit(
        self,
        wid: str,
        project: str,
        gpus: int = 0,
        gpu: float = 0.0,
        gpu_memory_gib: float = 0,
        workers: int = 1,
        priority: str = "training",
        preemptible: bool | None = None,
        min_runtime: float = 0.0,
        pools: Iterable[str] = (),
        models: Iterable[str] = (),
        clusters: Iterable[str] = (),
        cpus: float = 0,
        memory_gib: float = 0,
    ) -> Cluster:
        cls = class_named(priority)
        req = Request(
            gpus=gpus,
            gpu_milli=milli(gpu) or 0,
            gpu_memory_mib=round(gpu_memory_gib * 1024),
            cpu_milli=round(cpus * 1000),
            memory_mib=round(memory_gib * 1024),
        )
        self.now += 1
        self.workloads.append(
            Workload(
                wid,
                project,
                req,
                priority=cls.value,
                priority_class=cls.name,
                preemptible=cls.preemptible if preemptible is None else preemptible,
                min_runtime_s=min_runtime,
                gang_size=workers,
                pools=tuple(pools),
                gpu_models=tuple(models),
                clusters=tuple(clusters),
                submit_time=self.now,
            )
        )
        return self

    def running(self, wid: str, project: str, node: str, devices: Iterable[int], **submit: object) -> Cluster:
        """A workload already running on the given devices of one node: whole ones, or its share of the one
        device given when it asks for a fraction (`gpu=`) or GPU memory."""
        self.submit(wid, project, **submit)  # type: ignore[arg-type]
        w = self.workloads[-1]
        gpu = [d for n in self.nodes if n.name == node for d in n.devices if d.index in set(devices)]
        if w.request.gpu_milli or w.request.gpu_memory_mib:
            shares = tuple(DeviceShare(d.index, *w.request.share_on(d.memory_mib)) for d in gpu[:1])
        else:
            shares = tuple(DeviceShare(d.index, MILLI, d.memory_mib) for d in gpu)
        self.workloads[-1] = dataclasses.replace(
            w, state=State.RUNNING, placements=(Placement(0, node, shares),), start_time=self.now
        )
        return self

    def snapshot(self) -> Snapshot:
        return Snapshot(
            tuple(self.nodes),
            tuple(self.queues.values()),
            tuple(self.workloads),
            now=self.now,
            pool_settings=dict(self.pool_settings),
        )


class Run:
    """A snapshot driven through cycles, each decision applied as a perfect cluster would."""

    def __init__(self, snapshot: Snapshot, config: SchedulerConfig | None = None) -> None:
        self.snapshot = snapshot
        self.config = config or SchedulerConfig()
        self.decisions: list[Decision] = []

    def cycle(self, advance: float = 1.0) -> Decision:
        decision = schedule(self.snapshot, self.config)
        self.decisions.append(decision)
        self.snapshot = apply_decision(self.snapshot, decision, self.snapshot.now + advance)
        return decision

    def settle(self, max_cycles: int = 20, advance: float = 1.0) -> Run:
        """Cycle until nothing changes, then prove five more cycles change nothing either."""
        for _ in range(max_cycles):
            d = self.cycle(advance)
            if not d.binds and not d.evictions:
                break
        else:
            raise AssertionError(f"no steady state after {max_cycles} cycles")
        for _ in range(5):
            d = self.cycle(advance)
            assert not d.binds and not d.evictions, f"flapping after steady state: {d.to_dict()}"
        return self

    def submit(self, cluster: Cluster, *args: object, **kwargs: object) -> Run:
        """Submit through the cluster builder, onto the current snapshot."""
        before = len(cluster.workloads)
        cluster.now = max(cluster.now, self.snapshot.now)
        cluster.submit(*args, **kwargs)  # type: ignore[arg-type]
        new = tuple(dataclasses.replace(w, submit_time=self.snapshot.now) for w in cluster.workloads[before:])
        self.snapshot = dataclasses.replace(self.snapshot, workloads=self.snapshot.workloads + new)
        return self

    def advance(self, seconds: float) -> Run:
        self.snapshot = dataclasses.replace(self.snapshot, now=self.snapshot.now + seconds)
        return self

    # -- reading -------------------------------------------------------------------------------------

    def workload(self, wid: str) -> Workload:
        for w in self.snapshot.workloads:
            if w.id == wid:
                return w
        raise KeyError(wid)

    def running(self) -> set[str]:
        return {w.id for w in self.snapshot.workloads if w.state is State.RUNNING}

    def pending(self) -> set[str]:
        return {w.id for w in self.snapshot.workloads if w.state is State.PENDING}

    def evicted(self) -> list[str]:
        return [e.workload for d in self.decisions for e in d.evictions]

    def reason(self, wid: str) -> str:
        p = self.decisions[-1].pending_for(wid)
        return p.code.value if p else ""

    def used_gpus(self, project: str) -> float:
        total = sum(
            s.milli
            for w in self.snapshot.workloads
            if w.project == project and w.state is State.RUNNING
            for p in w.placements
            for s in p.devices
        )
        return total / MILLI
