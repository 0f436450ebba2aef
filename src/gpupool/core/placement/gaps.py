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
    """A node's GPU capacity expected to stay idle: each device's gap at its table value, or all of it when
    no typical GPU workload that fits the gap also fits in the node's free CPU and memory.

    Without the host check a gap is priced as if some share will come to close it; on a node whose CPUs
    are spent none can, and a whole GPU there is stranded. Pricing both lets a share's placement count the
    gaps its own CPUs close off."""

    def __init__(self, mix: TypicalMix, waste: GapWaste, cache: dict[Any, int]) -> None:
        self.waste = waste
        self.shapes = tuple(dict.fromkeys(r for r, _ in mix if r.gpus == 1 or r.gpu_milli or r.gpu_memory_mib))
        """Typical shapes that fit on one device, in the mix's order."""
        self._cache = cache
        """By (sorted free, CPU free, memory free, device memory): nodes in equal states cost the same."""

    def __call__(self, free: list[int], cpu_free: int, mem_free: int, mem_per_device: int) -> int:
        key = (tuple(sorted(free)), cpu_free, mem_free, mem_per_device)
        found = self._cache.get(key)
        if found is None:
            found = 0
            for gap in key[0]:
                if gap > 0:
                    found += self.waste[gap] if self._usable(gap, cpu_free, mem_free, mem_per_device) else gap
            self._cache[key] = found
        return found

    def _usable(self, gap: int, cpu_free: int, mem_free: int, mem_per_device: int) -> bool:
        for r in self.shapes:
            need = MILLI if r.gpus else r.share_on(max(1, mem_per_device))[0]
            if need <= gap and r.cpu_milli <= cpu_free and r.memory_mib <= mem_free:
                return True
        return False
