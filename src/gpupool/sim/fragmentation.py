"""The cluster-wide fragmentation measure of FGD (ATC'23), vectorised over nodes for reporting.

The same per-node definition drives the `fgd` placement policy in the core; here it is computed for the whole
cluster at once so the simulator can record it at every step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from gpupool.core import MILLI, Node, Request
from gpupool.core.placement.policies import TypicalMix
from gpupool.sim.traces import Pod

IntMatrix = npt.NDArray[np.int64]


def typical_mix(pods: Iterable[Pod], coverage_pct: int = 95) -> TypicalMix:
    """FGD's typical pods: shapes (CPU, GPU share, GPU count) by popularity until `coverage_pct` of the pods
    is covered, the shape that crosses the line included. Memory is not part of a shape, as in FGD."""
    counts = Counter(
        Request(gpus=p.num_gpu, cpu_milli=p.cpu_milli)
        if p.num_gpu > 1 or p.gpu_milli == MILLI
        else Request(gpu_milli=p.gpu_milli, cpu_milli=p.cpu_milli)
        if p.num_gpu
        else Request(cpu_milli=p.cpu_milli)
        for p in pods
    )
    total = sum(counts.values())
    ranked = sorted(
        counts.items(),
        key=lambda kv: (-kv[1], -kv[0].cpu_milli, -(kv[0].gpu_milli or 1000 * (kv[0].gpus > 0)), -kv[0].gpus),
    )
    mix: list[tuple[Request, int]] = []
    covered = 0
    for req, n in ranked:
        mix.append((req, n))
        covered += n
        if covered * 100 >= coverage_pct * total:
            break
    return tuple(mix)


class ClusterGpus:
    """Free capacity of every node as arrays: devices (n x max devices, -1 where a node has fewer), CPU, memory."""

    def __init__(self, nodes: tuple[Node, ...]) -> None:
        width = max((len(n.devices) for n in nodes), default=0)
        self.index = {n.name: i for i, n in enumerate(nodes)}
        self.free = np.full((len(nodes), width), -1, dtype=np.int64)
        for i, n in enumerate(nodes):
            self.free[i, : len(n.devices)] = MILLI
        self.cpu_free = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
        self.mem_free = np.array([n.memory_mib for n in nodes], dtype=np.int64)
        self.total_milli = int((self.free > 0).sum()) * MILLI

    def take(self, node: str, device_milli: Iterable[tuple[int, int]], cpu_milli: int, memory_mib: int) -> None:
        i = self.index[node]
        for d, milli in device_milli:
            self.free[i, d] -= milli
        self.cpu_free[i] -= cpu_milli
        self.mem_free[i] -= memory_mib

    def allocated_milli(self) -> int:
        return self.total_milli - int(np.where(self.free > 0, self.free, 0).sum())

    def fragment_milli(self, mix: TypicalMix) -> float:
        """Expected idle milli-GPU that a workload drawn from `mix` could not use, summed over nodes."""
        free = np.where(self.free > 0, self.free, 0)
        idle = free.sum(axis=1)
        total_weight = sum(w for _, w in mix) or 1
        frag = np.zeros(len(idle), dtype=np.float64)
        for t, weight in mix:
            host = (self.cpu_free >= t.cpu_milli) & (self.mem_free >= t.memory_mib)
            if not (t.gpus or t.gpu_milli):
                frag += weight * idle  # to CPU-only work every idle GPU is stranded
                continue
            if t.gpus:
                ok = host & ((self.free == MILLI).sum(axis=1) >= t.gpus)
                part = np.where(ok, np.where(free < MILLI, free, 0).sum(axis=1), idle)
            elif t.gpu_milli:
                ok = host & (free >= t.gpu_milli).any(axis=1)
                part = np.where(ok, np.where(free < t.gpu_milli, free, 0).sum(axis=1), idle)
            else:
                continue
            frag += weight * part
        return float(frag.sum()) / total_weight

    def idle_milli(self) -> int:
        return int(np.where(self.free > 0, self.free, 0).sum())
