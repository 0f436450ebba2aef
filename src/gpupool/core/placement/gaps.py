"""What a gap left on a device costs: the GPU it is expected to leave idle for good.

A share placed on a device leaves a gap beside it. Whether that gap is ever used depends on the work that
comes later: a gap of 0.53 after a 0.47 share is usually closed by another 0.47 (0.06 left idle), a gap of
0.19 beside a 0.81 share almost never is, because few shares are that small. Best fit, which takes the
smallest gap that fits, cannot tell these apart.

`gap_waste` learns the difference from the typical mix: it replays draws from the mix into an empty pool by
best fit, as a cluster fills, and records for each gap size the idle capacity that gaps of that size were
finally left with. The placement policy then prefers the device where a share raises that expected idle
capacity least (or lowers it most, when it fills a gap that would otherwise stay idle).
"""

from __future__ import annotations

import bisect
import random
from collections import defaultdict
from typing import Any

from gpupool.core.model import MILLI
from gpupool.core.placement.policies import TypicalMix

GapWaste = tuple[int, ...]
"""Indexed by a device's free milli-GPU (0..MILLI): the milli-GPU a gap of that size is expected to leave
idle. A whole free device costs nothing: whole-GPU work can still take it."""

REPLAY_DEVICES = 3_000
"""Devices in one replay: enough that each share size meets many gaps, small enough to take milliseconds."""
REPLAY_ROUNDS = 8
"""Replays averaged, so the table does not hang on one draw of arrivals."""


Shapes = tuple[tuple[int, int, int], ...]
"""(whole GPUs, milli-GPU share, weight in per mille of GPU work): what a gap table depends on."""


def gpu_shapes(mix: TypicalMix) -> Shapes:
    """The mix's GPU shapes by size alone, weights rounded to per mille, so that small changes in a live
    mix (one more workload of a common shape) leave the table as it was and need no new replay."""
    counts: dict[tuple[int, int], int] = defaultdict(int)
    for r, w in mix:
        if r.gpus or r.gpu_milli:
            counts[(r.gpus, 0 if r.gpus else r.gpu_milli)] += w
    total = sum(counts.values())
    shapes = ((g, m, (1000 * w + total // 2) // total) for (g, m), w in sorted(counts.items()))
    return tuple(s for s in shapes if s[2])


def gap_waste(shapes: Shapes, seed: int = 0) -> GapWaste:
    """Expected idle milli-GPU per gap size, by replaying the shapes into an empty pool with best fit."""
    sizes = [(g, m) for g, m, _ in shapes]
    weights = [w for _, _, w in shapes]
    total = [0] * (MILLI + 1)
    seen = [0] * (MILLI + 1)
    rng = random.Random(seed)
    if any(milli for _, milli in sizes):
        for _ in range(REPLAY_ROUNDS):
            for gap, left in _replay(sizes, weights, rng):
                total[gap] += left
                seen[gap] += 1
    return tuple(
        0 if gap == MILLI else (total[gap] + seen[gap] // 2) // seen[gap] if seen[gap] else gap
        for gap in range(MILLI + 1)
    )


def _replay(shapes: list[tuple[int, int]], weights: list[int], rng: random.Random) -> list[tuple[int, int]]:
    """One fill of an empty pool: (gap size, the gap its device ended with) for every gap a share made."""
    empty = REPLAY_DEVICES
    demand = 0
    levels: list[int] = []  # gap sizes present, ascending
    devices_at: dict[int, list[int]] = defaultdict(list)
    final: list[int] = []
    history: list[tuple[int, int]] = []
    while True:
        gpus, milli = rng.choices(shapes, weights)[0]
        demand += gpus * MILLI if gpus else milli
        if demand > REPLAY_DEVICES * MILLI:
            break
        if gpus:
            if empty >= gpus:
                empty -= gpus
            continue
        at = bisect.bisect_left(levels, milli)
        if at < len(levels):
            gap = levels[at]
            device = devices_at[gap].pop()
            if not devices_at[gap]:
                levels.pop(at)
        elif empty:
            gap, device = MILLI, len(final)
            empty -= 1
            final.append(MILLI)
        else:
            continue
        left = gap - milli
        final[device] = left
        history.append((device, left))
        if left:
            if not devices_at[left]:
                bisect.insort(levels, left)
            devices_at[left].append(device)
    return [(left, final[device]) for device, left in history]


class ExpectedIdle:
    """A node's GPU capacity expected to stay idle, in milli-GPU. Three parts:

    - each device's gap at its table value (`gap_waste`);
    - in full, a gap no typical GPU workload can use for want of CPU or memory. The node's gaps are served
      largest first, each taking the CPU and memory of the cheapest typical shape that fits it, so the last
      CPUs count once, not for every gap that could use them;
    - the GPU the node's CPUs cannot feed. Typical GPU work spends, on average, so many millicores (and MiB)
      per milli-GPU; a node whose free CPU is less than its gaps are expected to use times that rate will
      leave the difference idle. The cheapest shape says whether a gap can be used at all; the rate says
      whether the node can be filled, which it cannot when its CPUs went to work that needs more than its
      share.

    Without the host parts a gap is priced as if some workload will come to close it; on a node whose CPUs
    are spent none can, and its GPUs are stranded. Pricing them lets a placement count the GPUs its own CPUs
    close off, so CPU-hungry work goes where CPUs are plentiful and CPU-light work where they are short."""

    def __init__(self, mix: TypicalMix, waste: GapWaste, cache: dict[Any, int]) -> None:
        self.waste = waste
        self.shapes = tuple(dict.fromkeys(r for r, _ in mix if r.gpus == 1 or r.gpu_milli or r.gpu_memory_mib))
        """Typical shapes that fit on one device, in the mix's order."""
        gpu = cpu = memory = 0
        for r, w in mix:
            milli = r.gpus * MILLI if r.gpus else r.gpu_milli
            if milli:
                gpu, cpu, memory = gpu + w * milli, cpu + w * r.cpu_milli, memory + w * r.memory_mib
        self._rate = (gpu, cpu, memory)
        """Typical GPU work's milli-GPU, millicores and MiB, weighted alike: the rates are their ratios."""
        self._cache = cache
        """By (sorted free, CPU free, memory free, device memory): nodes in equal states cost the same."""
        self._fits: dict[tuple[int, int], list[tuple[int, int]]] = {}

    def __call__(self, free: list[int], cpu_free: int, mem_free: int, mem_per_device: int) -> int:
        key = (tuple(sorted(free)), cpu_free, mem_free, mem_per_device)
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = self._compute(key[0], cpu_free, mem_free, mem_per_device)
        return found

    def _compute(self, free: tuple[int, ...], cpu_free: int, mem_free: int, mem_per_device: int) -> int:
        idle = used = 0
        cpu, memory = cpu_free, mem_free
        for gap in reversed(free):
            if gap <= 0:
                continue
            need = self._cheapest(gap, cpu, memory, mem_per_device)
            if need is None:
                idle += gap
            else:
                idle += self.waste[gap]
                used += gap - self.waste[gap]
                cpu, memory = cpu - need[0], memory - need[1]
        gpu, cpu_work, mem_work = self._rate
        short = 0
        if cpu_work:
            short = max(short, used - max(0, cpu_free) * gpu // cpu_work)
        if mem_work:
            short = max(short, used - max(0, mem_free) * gpu // mem_work)
        return idle + short

    def _cheapest(self, gap: int, cpu_free: int, mem_free: int, mem_per_device: int) -> tuple[int, int] | None:
        """The CPU and memory of the cheapest typical shape that fits the gap and the host, if any does."""
        for cpu, memory in self._fitting(gap, mem_per_device):
            if cpu <= cpu_free and memory <= mem_free:
                return cpu, memory
        return None

    def _fitting(self, gap: int, mem_per_device: int) -> list[tuple[int, int]]:
        """(CPU, memory) of the typical shapes that fit a gap on devices of this memory, cheapest first."""
        found = self._fits.get((gap, mem_per_device))
        if found is None:
            found = sorted(
                {
                    (r.cpu_milli, r.memory_mib)
                    for r in self.shapes
                    if (MILLI if r.gpus else r.share_on(max(1, mem_per_device))[0]) <= gap
                }
            )
            self._fits[(gap, mem_per_device)] = found
        return found
