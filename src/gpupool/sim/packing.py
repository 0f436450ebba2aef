"""The FGD packing experiment (ATC'23) replayed through gpupool's own `schedule()`.

The cluster is a node list; the workload is a pod list inflated by sampling with replacement until its GPU
requests reach `tune` x capacity, then shuffled. Pods arrive one at a time, never finish, and a pod that
cannot be placed when it arrives is dropped. After each arrived 1% of GPU capacity the GPU allocation and
the fragmentation rate are recorded.

Arrivals between two measurement points go to the core together, in arrival order, within one cycle with
only the allocate action: one project, one priority, so the core places them in submit order against the
state its earlier placements left, exactly as one-at-a-time arrival would. Pods it could not place are then
dropped, as the experiment drops them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from gpupool.core import MILLI, Node, Queue, SchedulerConfig, Snapshot, State, Workload, schedule
from gpupool.core.placement.memo import Memo
from gpupool.sim.fragmentation import ClusterGpus, typical_mix
from gpupool.sim.traces import Pod

PROJECT = "trace"
MAX_PCT = 130


@dataclass(frozen=True, slots=True)
class Point:
    arrived_pct: int
    allocated_milli: int
    total_milli: int
    frag_milli: float
    idle_milli: int
    placed: int
    failed: int

    @property
    def unallocated_gpu_pct(self) -> float:
        return 100.0 * (self.total_milli - self.allocated_milli) / self.total_milli

    @property
    def frag_rate_pct(self) -> float:
        return 100.0 * self.frag_milli / self.idle_milli if self.idle_milli else 0.0


def inflate(pods: tuple[Pod, ...], capacity_milli: int, tune: float, rng: random.Random) -> list[Pod]:
    """Sample pods with replacement until their GPU requests reach `tune` x capacity (drop some if above)."""
    target = tune * capacity_milli
    out = list(pods)
    total = sum(p.gpu_request_milli for p in out)
    if total < target:
        while True:
            pod = pods[rng.randrange(len(pods))]
            if total + pod.gpu_request_milli > target:
                break
            out.append(pod)
            total += pod.gpu_request_milli
    else:
        while total > target and out:
            pod = out.pop(rng.randrange(len(out)))
            total -= pod.gpu_request_milli
    return out


def arrival_order(pods: list[Pod], rng: random.Random) -> list[Pod]:
    ordered = sorted(pods, key=lambda p: p.name)
    rng.shuffle(ordered)
    return ordered


def run_seed(
    nodes: tuple[Node, ...],
    pods: tuple[Pod, ...],
    policy: str,
    seed: int,
    tune: float = 1.3,
    progress: Callable[[int], None] | None = None,
) -> list[Point]:
    """One seed of the experiment: a measurement point for every arrived percent 0..130."""
    rng = random.Random(seed)
    workload = arrival_order(inflate(pods, _capacity(nodes), tune, rng), rng)
    config = SchedulerConfig(
        policy=policy, actions=("allocate",), typical_mix=typical_mix(p.request() for p in pods), seed=seed
    )
    memo = Memo()
    gpus = ClusterGpus(nodes)
    queue = (Queue(PROJECT),)
    running: list[Workload] = []
    batch: list[Workload] = []
    points: list[Point] = []
    arrived = placed = failed = 0
    mix = config.typical_mix or ()

    def flush() -> None:
        nonlocal placed, failed
        if not batch:
            return
        snapshot = Snapshot(nodes, queue, (*running, *batch), now=float(len(running) + len(batch)))
        decision = schedule(snapshot, config, memo=memo)
        bound = {b.workload: b for b in decision.binds}
        for w in batch:
            b = bound.get(w.id)
            if b is None:
                failed += 1
                continue
            placed += 1
            running.append(_running(w, b.placements))
            for p in b.placements:
                gpus.take(p.node, ((d.index, d.milli) for d in p.devices), w.request.cpu_milli, w.request.memory_mib)
        batch.clear()

    def measure(k: int) -> None:
        flush()
        points.append(
            Point(k, gpus.allocated_milli(), gpus.total_milli, gpus.fragment_milli(mix), gpus.idle_milli(), placed, failed)
        )
        if progress is not None:
            progress(k)

    next_pct = 0
    for i, pod in enumerate(workload):
        batch.append(
            Workload(f"{i:06d}", PROJECT, pod.request(), gpu_models=pod.gpu_spec, submit_time=float(i))
        )
        arrived += pod.gpu_request_milli
        while next_pct <= MAX_PCT and arrived * 100 >= next_pct * gpus.total_milli:
            measure(next_pct)
            next_pct += 1
    while next_pct <= MAX_PCT:
        measure(next_pct)
        next_pct += 1
    return points


def _capacity(nodes: tuple[Node, ...]) -> int:
    return sum(len(n.devices) for n in nodes) * MILLI


def _running(w: Workload, placements: tuple) -> Workload:  # type: ignore[type-arg]
    from dataclasses import replace

    return replace(w, state=State.RUNNING, placements=placements, start_time=w.submit_time)
