"""The FGD packing experiment (ATC'23) replayed through gpupool's own `schedule()`.

The cluster is a node list; the workload is a pod list, shuffled and inflated by sampling with replacement
until its GPU requests reach `tune` x capacity. Pods arrive one at a time, never finish, and a pod that
cannot be placed when it arrives is dropped. The GPU allocation and the fragmentation rate are recorded for
every arrived percent of GPU capacity.

The pods of one arrived percent go to the core together, in arrival order, within one cycle with only the
allocate action: one project, one priority, so the core places them in submit order against the state its
earlier placements left, exactly as one-at-a-time arrival would. Pods it could not place are then dropped,
as the experiment drops them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from gpupool.core import MILLI, Node, Queue, SchedulerConfig, Snapshot, State, Workload, schedule
from gpupool.core.placement.memo import Memo
from gpupool.core.placement.models import model_demand
from gpupool.sim.apply import apply
from gpupool.sim.fragmentation import ClusterGpus, typical_mix
from gpupool.sim.pools import shared_pools
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


def arrivals(pods: tuple[Pod, ...], capacity_milli: int, tune: float, rng: random.Random) -> list[Pod]:
    """The arrival sequence, as the authors' simulator builds it.

    The trace's pods, sorted by name and shuffled; then, while the GPU requests are below `tune` x capacity,
    pods drawn with replacement from the name-sorted trace are appended (not shuffled again). Like the
    original, the stop test adds a drawn pod's per-GPU share, not its total, and stops at the first draw that
    would pass the target; above the target, random pods are removed instead.
    """
    by_name = sorted(pods, key=lambda p: p.name)
    order = list(by_name)
    rng.shuffle(order)
    target = tune * capacity_milli
    total = sum(p.gpu_request_milli for p in order)
    if total < target:
        while True:
            pod = by_name[rng.randrange(len(by_name))]
            if total + (pod.gpu_milli if pod.num_gpu else 0) > target:
                break
            order.append(pod)
            total += pod.gpu_request_milli
    else:
        while total > target and order:
            total -= order.pop(rng.randrange(len(order))).gpu_request_milli
    return order


def run_seed(
    nodes: tuple[Node, ...],
    pods: tuple[Pod, ...],
    policy: str,
    seed: int,
    tune: float = 1.3,
) -> list[Point]:
    """One seed of the experiment: a measurement point for every arrived percent 0..130.

    As in the authors' analysis, each pod's arrival is a sample: arrived % is the GPU requested by every pod
    so far (placed or not) over capacity, rounded to a whole percent, and point k averages the allocation
    after each pod whose arrived % rounds to k. Fragmentation is measured once per point, after its pods.
    """
    rng = random.Random(seed)
    sequence = arrivals(pods, _capacity(nodes), tune, rng)
    config = SchedulerConfig(
        policy=policy,
        actions=("allocate",),
        typical_mix=typical_mix(pods),
        seed=seed,
        model_demand=model_demand((p.gpu_spec, p.gpu_request_milli) for p in pods),
    )
    memo = Memo()
    gpus = ClusterGpus(nodes, config.typical_mix or ())
    cluster = Snapshot(nodes, (Queue(PROJECT),), (), pool_settings=shared_pools(nodes))
    samples: dict[int, list[float]] = {}
    frag: dict[int, tuple[float, int]] = {}
    counts: dict[int, tuple[int, int]] = {}
    placed = failed = 0
    arrived = 0
    i = 0
    while i < len(sequence):
        band = _band(arrived + sequence[i].gpu_request_milli, gpus.total_milli)
        if band > MAX_PCT:
            break
        batch: list[Workload] = []
        while i < len(sequence) and _band(arrived + sequence[i].gpu_request_milli, gpus.total_milli) == band:
            pod = sequence[i]
            arrived += pod.gpu_request_milli
            batch.append(Workload(f"{i:06d}", PROJECT, pod.request(), gpu_models=pod.gpu_spec, submit_time=float(i)))
            i += 1
        snapshot = replace(cluster, workloads=(*cluster.workloads, *batch), now=float(i))
        applied = apply(snapshot, schedule(snapshot, config, memo=memo))
        # Pods that could not be placed when they arrived are dropped, as the experiment drops them.
        cluster = replace(
            applied.snapshot, workloads=tuple(w for w in applied.snapshot.workloads if w.state is State.RUNNING)
        )
        started = {w.id: w for w in applied.started}
        allocated = gpus.allocated_milli()
        for w in batch:
            s = started.get(w.id)
            if s is None:
                failed += 1
            else:
                placed += 1
                gpus.hold(s)
                allocated += sum(d.milli for p in s.placements for d in p.devices)
            samples.setdefault(band, []).append(round(100 * allocated / gpus.total_milli, 2))
        frag[band] = (gpus.fragment_milli(), gpus.idle_milli())
        counts[band] = (placed, failed)
    return [_point(k, samples, frag, counts, gpus.total_milli) for k in range(MAX_PCT + 1)]


def _band(arrived_milli: int, total_milli: int) -> int:
    return round(100 * arrived_milli / total_milli)


def _point(
    k: int,
    samples: dict[int, list[float]],
    frag: dict[int, tuple[float, int]],
    counts: dict[int, tuple[int, int]],
    total: int,
) -> Point:
    """Point k: the mean allocation over the pods of band k (else of its neighbours, as the authors do)."""
    near = samples.get(k) or [v for j in (k - 1, k + 1) for v in samples.get(j, [])]
    alloc_pct = sum(near) / len(near) if near else 0.0
    nearest = min(frag, key=lambda j: (abs(j - k), j)) if frag else None
    frag_milli, idle = frag[nearest] if nearest is not None else (0.0, total)
    placed, failed = counts[nearest] if nearest is not None else (0, 0)
    return Point(k, round(alloc_pct * total / 100), total, frag_milli, idle, placed, failed)


def _capacity(nodes: tuple[Node, ...]) -> int:
    return sum(len(n.devices) for n in nodes) * MILLI
