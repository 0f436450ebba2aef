"""The cluster-wide fragmentation of FGD (ATC'23), as the simulator records it at every step.

The measure is the core's own (`core.placement.fgd.weighted_fragment`, what the `fgd` and `gpupool` policies
score placements by), summed over nodes: the simulator only keeps track of what each node has free.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from gpupool.core import MILLI, Node, Workload
from gpupool.core.placement.fgd import mix_weight, weighted_fragment
from gpupool.core.placement.policies import TypicalMix, popular_shapes
from gpupool.sim.traces import Pod

_FreeKey = tuple[tuple[int, ...], int, int, int]


def typical_mix(pods: Iterable[Pod], coverage_pct: int = 95) -> TypicalMix:
    """FGD's typical pods of a trace. A shape is (CPU, GPU share, GPU count): memory is not part of it."""
    return popular_shapes((replace(p.request(), memory_mib=0) for p in pods), coverage_pct)


class ClusterGpus:
    """What every node has free as running work leaves it: milli-GPU per device (in device-index order), CPU
    and memory; and from that the GPU allocated, idle, and fragmented under a typical mix."""

    def __init__(self, nodes: tuple[Node, ...], mix: TypicalMix) -> None:
        self.index = {n.name: i for i, n in enumerate(nodes)}
        ordered = [sorted(n.devices, key=lambda d: d.index) for n in nodes]
        self._position = [{d.index: k for k, d in enumerate(devices)} for devices in ordered]
        self.free = [[MILLI] * len(devices) for devices in ordered]
        self.cpu_free = [n.cpu_milli for n in nodes]
        self.mem_free = [n.memory_mib for n in nodes]
        self._mem_per_device = [devices[0].memory_mib if devices else 0 for devices in ordered]
        self.total_milli = sum(len(devices) for devices in ordered) * MILLI
        self.mix = mix
        self._weighted = [0] * len(nodes)
        """Per node, its fragment times the mix's total weight (`weighted_fragment`), as of its last change."""
        self._dirty = set(range(len(nodes)))
        self._memo: dict[_FreeKey, int] = {}

    def hold(self, workload: Workload) -> None:
        """Take what a workload's placements hold: each member's device shares and its CPU and memory."""
        for p in workload.placements:
            i = self.index[p.node]
            for d in p.devices:
                self.free[i][self._position[i][d.index]] -= d.milli
            self.cpu_free[i] -= workload.request.cpu_milli
            self.mem_free[i] -= workload.request.memory_mib
            self._dirty.add(i)

    def idle_milli(self) -> int:
        return sum(sum(free) for free in self.free)

    def allocated_milli(self) -> int:
        return self.total_milli - self.idle_milli()

    def fragment_milli(self) -> float:
        """Expected idle milli-GPU that a workload drawn from the mix could not use, summed over nodes."""
        for i in self._dirty:
            key = (tuple(sorted(self.free[i])), self.cpu_free[i], self.mem_free[i], self._mem_per_device[i])
            found = self._memo.get(key)
            if found is None:
                found = self._memo[key] = weighted_fragment(self.free[i], *key[1:], self.mix)
            self._weighted[i] = found
        self._dirty.clear()
        return sum(self._weighted) / mix_weight(self.mix)
