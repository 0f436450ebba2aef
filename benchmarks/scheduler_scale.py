"""Scale benchmark for gpupool's scheduling core.

Builds an empty cluster of `--nodes` 8-GPU nodes in three pools, a 10 x 10 department/project tree with
per-pool quotas, and a seeded random workload mix, then measures:

* fill: one `schedule()` over `--pending` workloads on the empty cluster (placements per second);
* steady: one `schedule()` on a nearly full cluster (about 20 running and 10 new pending per node);
* estimates: the start-time forecast from the steady snapshot, spread over cycles as the live loop spreads it
  (`estimate_cost.py`): forked, as the live loop runs it (and with `--stepped`, stepped in the loop, as where
  there is no fork); the steady cycle target is checked with the forked forecast's dearest cycle cost added.

Progress goes to stdout as plain lines; the last line is one JSON object with the figures. Every figure
is measured on one core (the process is pinned when the platform allows), with `time.perf_counter` and the
cyclic collector paused as the live loop pauses it for a cycle (`steady_cycle_collector_on_s`: with it running,
as every figure before 2026-12-02 was measured), and peak RSS comes from `getrusage`. `decision_hash` is a
sha256 over the digests of the timed decisions, so two runs with the same arguments must print the same hash.

    python benchmarks/scheduler_scale.py                       # 1000 nodes, 10000 pending
    python benchmarks/scheduler_scale.py --nodes 100 --pending 1000
    python benchmarks/scheduler_scale.py --profile /tmp/sched  # writes /tmp/sched-fill.prof, -steady.prof
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import gc
import hashlib
import json
import os
import platform
import random
import resource
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from estimate_cost import measure
from gpupool.core import (
    MILLI,
    Decision,
    Device,
    Node,
    Queue,
    Quota,
    Request,
    SchedulerConfig,
    Snapshot,
    State,
    Workload,
    schedule,
)
from gpupool.core.priority import DEFAULT_CLASSES, PriorityClass
from gpupool.sim.apply import apply_decision
from gpupool.sim.pools import shared_pools


@dataclass(frozen=True)
class PoolSpec:
    name: str
    fraction: float
    """Share of the cluster's nodes in this pool."""
    model: str
    gpu_memory_mib: int


POOLS: tuple[PoolSpec, ...] = (
    PoolSpec("h100", 0.4, "H100", 80 * 1024),
    PoolSpec("a100", 0.4, "A100", 80 * 1024),
    PoolSpec("l40s", 0.2, "L40S", 48 * 1024),
)
GPUS_PER_NODE = 8
NODE_CPU_MILLI = 128 * 1000
NODE_MEMORY_MIB = 1024 * 1024
CPU_PER_GPU_MILLI = 12 * 1000
"""Host resources asked per GPU: a little under a node's per-GPU share, so GPUs bind before CPU."""
MEMORY_PER_GPU_MIB = 96 * 1024
REFERENCE_GPU_MEMORY_MIB = 80 * 1024

DEPARTMENTS = 10
PROJECTS_PER_DEPARTMENT = 10

RUNNING_PER_NODE = 20
"""Steady phase: running workloads per node (20,000 at 1000 nodes)."""
STEADY_PENDING_PER_NODE = 10
"""Steady phase: fresh pending workloads per node (10,000 at 1000 nodes)."""
KEEP_FILL_FRACTION = 0.1
"""Steady phase: share of the fill phase's running workloads still running (the rest have finished)."""
STEADY_AGE_S = 3600.0
"""Steady phase: how long the warm-up's work has been running, so min-runtime no longer shields it."""
MAX_WARMUP_CYCLES = 40

CLASS_WEIGHTS: dict[str, int] = {"production": 10, "training": 50, "interactive": 15, "batch": 25}

TARGETS: dict[str, float] = {"placements_per_s": 1000.0, "steady_cycle_s": 1.0, "peak_rss_mib": 1024.0}


# -- cluster and organisation --------------------------------------------------------------------------


def build_nodes(count: int) -> tuple[Node, ...]:
    per_pool = [int(count * p.fraction) for p in POOLS]
    per_pool[0] += count - sum(per_pool)
    nodes: list[Node] = []
    for spec, n in zip(POOLS, per_pool, strict=True):
        devices = tuple(Device(i, spec.model, spec.gpu_memory_mib) for i in range(GPUS_PER_NODE))
        nodes.extend(
            Node(f"{spec.name}-{i:05d}", spec.name, NODE_CPU_MILLI, NODE_MEMORY_MIB, devices) for i in range(n)
        )
    return tuple(nodes)


def pool_capacity(nodes: Sequence[Node]) -> dict[str, int]:
    capacity: Counter[str] = Counter()
    for n in nodes:
        capacity[n.pool] += len(n.devices) * MILLI
    return dict(capacity)


def split(total: int, weights: Sequence[float]) -> list[int]:
    """`total` in proportion to `weights`, floored (the sum never exceeds `total`)."""
    whole = sum(weights)
    return [int(total * w / whole) for w in weights]


def build_queues(capacity: dict[str, int], rng: random.Random) -> tuple[tuple[Queue, ...], list[str]]:
    """Departments whose deserved quotas add up to the cluster, projects that add up to at most their department."""
    dept_weights = [rng.uniform(0.5, 2.0) for _ in range(DEPARTMENTS)]
    dept_deserved = {pool: split(cap, dept_weights) for pool, cap in capacity.items()}
    queues: list[Queue] = []
    projects: list[str] = []
    for d in range(DEPARTMENTS):
        dept = f"dept-{d:02d}"
        dept_limited = rng.random() < 0.3
        dept_weight = rng.choice((1, 1, 2, 3))
        quotas: dict[str, Quota] = {}
        for pool in capacity:
            deserved = dept_deserved[pool][d]
            limit = deserved * 3 // 2 if dept_limited else None
            quotas[pool] = Quota(deserved=deserved, limit=limit, over_quota_weight=dept_weight)
        queues.append(Queue(dept, None, quotas))
        proj_weights = [rng.uniform(0.2, 1.0) for _ in range(PROJECTS_PER_DEPARTMENT)]
        covered = rng.uniform(0.8, 1.0)
        proj_deserved = {pool: split(int(dept_deserved[pool][d] * covered), proj_weights) for pool in capacity}
        for p in range(PROJECTS_PER_DEPARTMENT):
            name = f"{dept}-proj-{p}"
            limited = rng.random() < 0.25
            weight = rng.choice((1, 1, 1, 2, 4))
            pq: dict[str, Quota] = {}
            for pool in capacity:
                deserved = proj_deserved[pool][p]
                limit = max(2 * deserved, 16 * MILLI) if limited else None
                pq[pool] = Quota(deserved=deserved, limit=limit, over_quota_weight=weight)
            queues.append(Queue(name, dept, pq, strict_fifo=rng.random() < 0.05))
            projects.append(name)
    return tuple(queues), projects


# -- workloads -----------------------------------------------------------------------------------------


def host_share(milli: int) -> tuple[int, int]:
    """CPU millicores and host memory MiB in proportion to a GPU amount in milli-GPU."""
    return CPU_PER_GPU_MILLI * milli // MILLI, MEMORY_PER_GPU_MIB * milli // MILLI


def whole_request(gpus: int) -> Request:
    cpu, mem = host_share(gpus * MILLI)
    return Request(gpus=gpus, cpu_milli=cpu, memory_mib=mem)


def fraction_request(milli: int) -> Request:
    cpu, mem = host_share(milli)
    return Request(gpu_milli=milli, cpu_milli=cpu, memory_mib=mem)


def memory_request(gpu_memory_mib: int) -> Request:
    cpu, mem = host_share(gpu_memory_mib * MILLI // REFERENCE_GPU_MEMORY_MIB)
    return Request(gpu_memory_mib=gpu_memory_mib, cpu_milli=cpu, memory_mib=mem)


class WorkloadFactory:
    """Seeded workload generator; ids and submit times increase with every workload made."""

    def __init__(self, rng: random.Random, projects: Sequence[str], pools: Sequence[str]) -> None:
        self.rng = rng
        self.projects = list(projects)
        self.pools = list(pools)
        self.classes: list[PriorityClass] = list(DEFAULT_CLASSES)
        self.class_weights = [CLASS_WEIGHTS[c.name] for c in self.classes]
        self.count = 0

    def _pools(self) -> tuple[str, ...]:
        roll = self.rng.random()
        if roll < 0.15:
            return (self.rng.choice(self.pools),)
        if roll < 0.25:
            return tuple(self.rng.sample(self.pools, 2))
        return ()

    def _make(self, request: Request, gang_size: int, now: float) -> Workload:
        cls = self.rng.choices(self.classes, self.class_weights)[0]
        self.count += 1
        return Workload(
            id=f"w{self.count:08d}",
            project=self.rng.choice(self.projects),
            request=request,
            priority=cls.value,
            priority_class=cls.name,
            preemptible=cls.preemptible,
            min_runtime_s=cls.min_runtime_s,
            gang_size=gang_size,
            pools=self._pools(),
            submit_time=now + self.count * 1e-3,
        )

    def standard(self, now: float) -> Workload:
        """30% fractional, 60% 1..8 whole GPUs, 10% gangs of 2..16 members."""
        rng = self.rng
        roll = rng.random()
        if roll < 0.3:
            if rng.random() < 0.7:
                request = fraction_request(rng.choice((250, 250, 500, 500, 750)))
            else:
                request = memory_request(rng.choice((10, 20, 40)) * 1024)
            return self._make(request, 1, now)
        if roll < 0.9:
            return self._make(whole_request(rng.choice((1, 1, 1, 2, 2, 4, 4, 8))), 1, now)
        gpus = 8 if rng.random() < 0.7 else rng.choice((1, 2, 4))
        return self._make(whole_request(gpus), rng.randint(2, 16), now)

    def small(self, now: float) -> Workload:
        """The warm-up mix that packs about 2.5 workloads per GPU: mostly fractions, some single GPUs."""
        roll = self.rng.random()
        if roll < 0.3:
            request = fraction_request(125)
        elif roll < 0.7:
            request = fraction_request(250)
        elif roll < 0.9:
            request = fraction_request(500)
        else:
            request = whole_request(1)
        return self._make(request, 1, now)


# -- measuring -----------------------------------------------------------------------------------------


def cluster(
    count: int, rng: random.Random
) -> tuple[tuple[Node, ...], dict[str, int], tuple[Queue, ...], WorkloadFactory]:
    """The benchmark's cluster: nodes, each pool's GPU capacity, the organisation, and a workload factory."""
    nodes = build_nodes(count)
    capacity = pool_capacity(nodes)
    queues, projects = build_queues(capacity, rng)
    return nodes, capacity, queues, WorkloadFactory(rng, projects, sorted(capacity))


def log(message: str) -> None:
    print(message, flush=True)


def pin_one_core() -> str:
    """Pin the process to one CPU so the figures are single-core figures; returns what was done."""
    if not hasattr(os, "sched_setaffinity"):
        return "not pinned (unsupported)"
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[0]})
    return f"pinned to cpu {cpus[0]}"


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed_schedule(
    snapshot: Snapshot, config: SchedulerConfig, profile_to: str | None, collector: bool = False
) -> tuple[Decision, float, dict[str, float]]:
    """One timed cycle: the decision, its wall time, and the time of each of its steps. The cyclic collector is
    paused for it, as the live loop pauses it for a cycle (`control.controller`), unless `collector`."""
    steps: dict[str, float] = {}
    started: dict[str, float] = {}

    def observe(step: str, phase: str) -> None:
        t = time.perf_counter()
        if phase == "start":
            started[step] = t
        else:
            steps[step] = steps.get(step, 0.0) + t - started[step]

    gc.collect()
    if not collector:
        gc.disable()
    profiler = cProfile.Profile() if profile_to else None
    t0 = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    decision = schedule(snapshot, config, observe)
    if profiler is not None:
        profiler.disable()
    elapsed = time.perf_counter() - t0
    gc.enable()
    if profiler is not None and profile_to:
        profiler.dump_stats(profile_to)
    return decision, elapsed, steps


def count_states(snapshot: Snapshot) -> Counter[State]:
    return Counter(w.state for w in snapshot.workloads)


def fmt_steps(steps: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.3f}s" for k, v in steps.items())


# -- phases --------------------------------------------------------------------------------------------


def warm_up(snapshot: Snapshot, factory: WorkloadFactory, target_running: int, config: SchedulerConfig) -> Snapshot:
    """Finish most of the fill phase's work, then fill the cluster with small workloads up to the target."""
    rng = factory.rng
    kept = tuple(w for w in snapshot.workloads if w.state is State.RUNNING and rng.random() < KEEP_FILL_FRACTION)
    snapshot = dataclasses.replace(snapshot, workloads=kept, now=snapshot.now + 1.0)
    log(f"warm-up: kept {len(kept)} of the fill phase's running workloads; target {target_running} running")
    for cycle in range(MAX_WARMUP_CYCLES):
        states = count_states(snapshot)
        running, pending = states[State.RUNNING], states[State.PENDING]
        if running >= target_running:
            break
        add = max(0, target_running - running - pending) + max(100, (target_running - running) // 20)
        fresh = tuple(factory.small(snapshot.now) for _ in range(add))
        snapshot = dataclasses.replace(snapshot, workloads=snapshot.workloads + fresh)
        t0 = time.perf_counter()
        decision = schedule(snapshot, config)
        elapsed = time.perf_counter() - t0
        snapshot = apply_decision(snapshot, decision, snapshot.now + 1.0)
        log(
            f"warm-up cycle {cycle + 1}: +{add} pending, {len(decision.binds)} bound in {elapsed:.2f}s, "
            f"running {count_states(snapshot)[State.RUNNING]}"
        )
        if len(decision.binds) < max(1, add // 100):
            log("warm-up: the cluster takes no more small work; stopping short of the target")
            break
    # What the warm-up left waiting has been cancelled; only running work carries into the steady phase.
    running_only = tuple(w for w in snapshot.workloads if w.state is State.RUNNING)
    return dataclasses.replace(snapshot, workloads=running_only, now=snapshot.now + STEADY_AGE_S)


def gpu_utilisation(snapshot: Snapshot) -> float:
    capacity = sum(len(n.devices) for n in snapshot.nodes) * MILLI
    used = sum(s.milli for w in snapshot.workloads if w.state is State.RUNNING for p in w.placements for s in p.devices)
    return used / capacity if capacity else 0.0


def run(args: argparse.Namespace) -> dict[str, Any]:
    pinned = pin_one_core() if not args.no_pin else "not pinned (--no-pin)"
    log(f"gpupool scheduler scale benchmark: nodes={args.nodes} pending={args.pending} seed={args.seed}; {pinned}")
    rng = random.Random(args.seed)
    nodes, capacity, queues, factory = cluster(args.nodes, rng)
    config = SchedulerConfig()
    log(
        f"cluster: {len(nodes)} nodes, {sum(capacity.values()) // MILLI} GPUs "
        + ", ".join(f"{p}={c // MILLI}" for p, c in sorted(capacity.items()))
        + f"; {len(queues)} queues"
    )
    profile = args.profile

    # Phase 1: everything pending on an empty cluster.
    now = 1000.0
    workloads = tuple(factory.standard(now) for _ in range(args.pending))
    # Devices are shared across projects as in the published runs; --private-devices measures the live default.
    pools = {} if args.private_devices else shared_pools(nodes)
    snapshot = Snapshot(nodes, queues, workloads, now=now + 1.0, pool_settings=pools)
    fill, fill_s, fill_steps = timed_schedule(snapshot, config, f"{profile}-fill.prof" if profile else None)
    fill_binds = len(fill.binds)
    placements_per_s = fill_binds / fill_s if fill_s > 0 else 0.0
    snapshot = apply_decision(snapshot, fill, snapshot.now + 1.0)
    log(
        f"fill: {fill_binds} bound of {args.pending} in {fill_s:.3f}s = {placements_per_s:.0f} placements/s; "
        f"GPU use {gpu_utilisation(snapshot):.1%}; steps {fmt_steps(fill_steps)}"
    )

    # Phase 2: a nearly full cluster with fresh work waiting.
    target_running = RUNNING_PER_NODE * args.nodes
    snapshot = warm_up(snapshot, factory, target_running, SchedulerConfig(actions=("allocate",)))
    fresh = tuple(factory.standard(snapshot.now) for _ in range(STEADY_PENDING_PER_NODE * args.nodes))
    snapshot = dataclasses.replace(snapshot, workloads=snapshot.workloads + fresh)
    states = count_states(snapshot)
    log(
        f"steady: {states[State.RUNNING]} running, {states[State.PENDING]} pending, "
        f"GPU use {gpu_utilisation(snapshot):.1%}"
    )
    steady, steady_s, steady_steps = timed_schedule(snapshot, config, f"{profile}-steady.prof" if profile else None)
    _, steady_gc_s, _ = timed_schedule(snapshot, config, None, collector=True)  # as figures before 2026-12-02
    log(
        f"steady cycle: {steady_s:.3f}s, {len(steady.binds)} bound, {len(steady.evictions)} evicted, "
        f"stats {dict(sorted(steady.stats.items()))}; steps {fmt_steps(steady_steps)}"
    )

    # The live loop forecasts start times after each cycle under a time budget; what that adds to a cycle.
    log("estimates: the forecast from the steady snapshot, spread over cycles as the live loop spreads it")
    estimates = measure(
        snapshot,
        config,
        factory.projects,
        random.Random(args.seed + 1),
        log=log,
        stepped=args.stepped,
        cycle=lambda: schedule(snapshot, config),
    )
    # The live default forks: the dearer of the cycle that starts the forecast and the one that reads it back.
    forked = estimates["forked"]
    # The cycle right after a fork is the dearest: it pays the copies of the pages it writes (copy on write).
    with_estimates = max(steady_s, *forked["cycles_after_fork_s"]) + forked["per_cycle_max_s"]
    log(
        f"estimates, forked: {forked['per_cycle_max_s']:.3f}s at most a cycle, done in {forked['wall_s']:.1f}s; "
        f"the cycles right after the fork {forked['cycles_after_fork_s']}; steady cycle with estimates "
        f"{with_estimates:.3f}s"
    )
    if args.stepped:
        log(
            f"estimates stepped in the loop: {estimates['total_s']:.3f}s in all over {estimates['cycles_to_finish']} "
            f"cycles, {estimates['per_cycle_mean_s']:.3f}s a cycle (max {estimates['per_cycle_max_s']:.3f}s)"
        )

    decision_hash = hashlib.sha256((fill.digest() + steady.digest()).encode()).hexdigest()
    result: dict[str, Any] = {
        "placements_per_s": round(placements_per_s, 1),
        "fill_s": round(fill_s, 4),
        "fill_binds": fill_binds,
        "fill_steps_s": {k: round(v, 4) for k, v in fill_steps.items()},
        "steady_cycle_s": round(steady_s, 4),
        "steady_cycle_collector_on_s": round(steady_gc_s, 4),
        "steady_running": states[State.RUNNING],
        "steady_pending": states[State.PENDING],
        "steady_binds": len(steady.binds),
        "steady_evictions": len(steady.evictions),
        "steady_steps_s": {k: round(v, 4) for k, v in steady_steps.items()},
        "estimates": estimates,
        "steady_cycle_with_estimates_s": round(with_estimates, 4),
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "decision_hash": decision_hash,
        "nodes": args.nodes,
        "pending": args.pending,
        "seed": args.seed,
        "python": platform.python_version(),
        "pinned": pinned,
        "profiled": bool(profile),
    }
    if args.stepped:
        result["steady_cycle_with_stepped_estimates_s"] = round(steady_s + estimates["per_cycle_mean_s"], 4)
        result["steady_cycle_with_stepped_estimates_max_s"] = round(steady_s + estimates["per_cycle_max_s"], 4)
    result["meets_targets"] = {
        "placements_per_s": result["placements_per_s"] >= TARGETS["placements_per_s"],
        "steady_cycle_s": result["steady_cycle_with_estimates_s"] <= TARGETS["steady_cycle_s"],
        "peak_rss_mib": result["peak_rss_mib"] <= TARGETS["peak_rss_mib"],
    }
    return result


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000, help="8-GPU nodes in the cluster (default 1000)")
    parser.add_argument("--pending", type=int, default=10000, help="workloads pending in the fill phase")
    parser.add_argument("--seed", type=int, default=1, help="seed of the workload and quota generator")
    parser.add_argument("--profile", metavar="PREFIX", help="cProfile the timed cycles into PREFIX-{fill,steady}.prof")
    parser.add_argument("--no-pin", action="store_true", help="do not pin the process to one CPU")
    parser.add_argument(
        "--stepped",
        action="store_true",
        help="also measure the forecast stepped in the loop, as where there is no fork (as long again)",
    )
    parser.add_argument(
        "--private-devices", action="store_true", help="pools keep each device to one project (the live default)"
    )
    args = parser.parse_args(argv)
    if args.nodes < 5 or args.pending < 1:
        parser.error("--nodes must be at least 5 and --pending at least 1")
    return args


def main(argv: Sequence[str] | None = None, emit: Callable[[str], None] = log) -> int:
    result = run(parse_args(argv))
    emit(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
