"""The cluster-wide fragmentation measure of FGD (ATC'23), vectorised over nodes for reporting.

The same per-node definition drives the `fgd` placement policy in the core; here it is computed for the whole
cluster at once so the simulator can record it at every step.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from gpupool.core import MILLI, Node
from gpupool.core.placement.policies import TypicalMix, popular_shapes
from gpupool.sim.traces import Pod

IntMatrix = npt.NDArray[np.int64]


def typical_mix(pods: Iterable[Pod], coverage_pct: int = 95) -> TypicalMix:
    """FGD's typical pods of a trace. A shape is (CPU, GPU share, GPU count): memory is not part of it."""
    return popular_shapes((replace(p.request(), memory_mib=0) for p in pods), coverage_pct)


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
