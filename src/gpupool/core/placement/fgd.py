"""Fragmentation-gradient placement (FGD, USENIX ATC'23) and gpupool's default policy built on it.

A node's fragmentation is the idle GPU capacity (milli) that a workload drawn from the typical mix could not
use there: all of it when the workload's GPUs or CPUs do not fit (and always for a CPU-only workload), else
the devices with less free than it needs. Weighted by each typical shape's popularity. FGD places a request
where that figure grows least; the simulator reports the same measure summed over nodes (`sim.fragmentation`).
"""

from __future__ import annotations

import math

from gpupool.core.model import MILLI, DeviceShare, Request
from gpupool.core.placement.devices import free_whole_devices, share_candidates, whole_shares
from gpupool.core.placement.gaps import ExpectedIdle, gap_waste, gpu_shapes
from gpupool.core.placement.policies import Policy, PolicyContext, TypicalMix, register
from gpupool.core.state import NodeState

_Found = tuple[tuple[DeviceShare, ...] | None, float]
_Key = tuple[int, Request, bool, frozenset[str], tuple[bool, ...] | None]
NodeFree = tuple[list[int], int, int, int]
"""A node's free resources as the fragment and idle measures read them: milli-GPU free per device, CPU free,
memory free, memory per device."""


def typical_fragment(free: list[int], cpu_free: int, mem_free: int, mem_per_device: int, t: Request) -> int:
    """Idle milli-GPU on one node that a workload of shape `t` could not use."""
    idle = sum(free)
    if idle == 0:
        return 0
    if t.gpus == 0 and t.gpu_milli == 0 and t.gpu_memory_mib == 0:
        return idle  # a CPU-only workload uses no GPU: to it every idle GPU is stranded
    if t.cpu_milli > cpu_free or t.memory_mib > mem_free:
        return idle
    if t.gpus:
        if sum(1 for f in free if f == MILLI) >= t.gpus:
            return sum(f for f in free if f < MILLI)
        return idle
    need = t.gpu_milli or min(MILLI, -(-t.gpu_memory_mib * MILLI // max(1, mem_per_device)))
    if any(f >= need for f in free):
        return sum(f for f in free if f < need)
    return idle


def weighted_fragment(free: list[int], cpu_free: int, mem_free: int, mem_per_device: int, mix: TypicalMix) -> int:
    """A node's fragment under the typical mix: each shape's part weighted by its popularity, not yet divided
    by the mix's total weight (`mix_weight`). Integers, so the simulator's sums over nodes are exact."""
    return sum(w * typical_fragment(free, cpu_free, mem_free, mem_per_device, t) for t, w in mix)


def mix_weight(mix: TypicalMix) -> int:
    return sum(w for _, w in mix) or 1


def node_free(node: NodeState) -> NodeFree:
    """A node's free resources as the fragment and idle measures read them (see `NodeFree`)."""
    free_cpu = node.cpu - node.used_cpu - node.rel_cpu
    free_memory = node.memory - node.used_memory - node.rel_memory
    return [d.free_milli() for d in node.devices], free_cpu, free_memory, node.devices[0].memory if node.devices else 0


class Fragmentation:
    """A node's expected fragment under a typical mix, memoised by the node's free resources."""

    def __init__(self, ctx: PolicyContext) -> None:
        self.mix = ctx.mix
        self.total_weight = mix_weight(ctx.mix)
        self._memo: dict[tuple[tuple[int, ...], int, int, int], float] = ctx.memo.table("fragment", ctx.mix)

    def __call__(self, free: list[int], cpu_free: int, mem_free: int, mem_per_device: int) -> float:
        key = (tuple(sorted(free)), cpu_free, mem_free, mem_per_device)
        found = self._memo.get(key)
        if found is None:
            weighted = weighted_fragment(free, cpu_free, mem_free, mem_per_device, self.mix)
            found = self._memo[key] = weighted / self.total_weight
        return found


class FgdPolicy(Policy):
    """FGD as its authors' simulator scores it: int(100 * sigmoid(fragment decrease / 1000))."""

    name = "fgd"
    ties = "order"

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.fragment = Fragmentation(ctx)
        self._cache: dict[_Key, _Found] = ctx.memo.table(self.name, *self._scores_depend_on(ctx))
        """By node signature (and which devices admit the project's shares): nodes in identical states share
        their evaluations."""

    def _scores_depend_on(self, ctx: PolicyContext) -> tuple[object, ...]:
        """What, beside node state and request, the evaluations depend on: it keys the cache kept across
        cycles."""
        return (ctx.mix,)

    def evaluate(
        self, node: NodeState, req: Request, pipelined: bool, models: frozenset[str], project: int
    ) -> tuple[tuple[DeviceShare, ...], float] | None:
        if node.signature < 0:
            shares, value = self._compute(node, req, pipelined, models, project)
        else:
            key = (node.signature, req, pipelined, models, node.admission(req, project, pipelined))
            found = self._cache.get(key)
            if found is None:
                found = self._cache[key] = self._compute(node, req, pipelined, models, project)
            shares, value = found
        return None if shares is None else (shares, value)

    def _options(
        self, node: NodeState, req: Request, pipelined: bool, models: frozenset[str], project: int
    ) -> tuple[NodeFree, list[tuple[tuple[DeviceShare, ...], NodeFree]]]:
        """The node's free resources now, and each way to place the request on it with what it leaves free."""
        before = node_free(node)
        free, cpu_free, mem_free, mem_dev = before
        cpu_after, mem_after = cpu_free - req.cpu_milli, mem_free - req.memory_mib
        if req.gpus:
            devices = free_whole_devices(node, pipelined, models)
            if len(devices) < req.gpus:
                return before, []
            shares = whole_shares(devices[: req.gpus])
            after = list(free)
            for s in shares:
                after[_position(node, s.index)] = 0
            return before, [(shares, (after, cpu_after, mem_after, mem_dev))]
        if req.gpu_milli or req.gpu_memory_mib:
            out: list[tuple[tuple[DeviceShare, ...], NodeFree]] = []
            for d, milli, mem in share_candidates(node, req, pipelined, models, project):
                after = list(free)
                pos = _position(node, d.index)
                after[pos] = max(0, after[pos] - milli)
                out.append(((DeviceShare(d.index, milli, mem),), (after, cpu_after, mem_after, mem_dev)))
            return before, out
        return before, [((), (free, cpu_after, mem_after, mem_dev))]

    def _compute(self, node: NodeState, req: Request, pipelined: bool, models: frozenset[str], project: int) -> _Found:
        best: _Found = (None, 0.0)
        before, options = self._options(node, req, pipelined, models, project)
        fragment = self.fragment(*before)
        for shares, after in options:
            value = _score(fragment - self.fragment(*after))
            if best[0] is None or value > best[1]:  # first device reaching the best score
                best = (shares, value)
        return best


class GpupoolPolicy(FgdPolicy):
    """The default: FGD's fragmentation gradient, priced in the GPU each placement is expected to leave idle
    for good, and CPU-only work where GPUs are already taken.

    - FGD's coarse score (an integer of the sigmoid) groups placements that change fragmentation alike, and
      ties go to the first node in a fixed order drawn from the seed, which consolidates work onto the same
      nodes and keeps others whole.
    - GPU work also pays for the change in the node's expected idle GPU (`gaps.ExpectedIdle`):
      - the gap a share leaves, at what gaps of that size finally leave idle (`gaps.gap_waste`, learned
        from the typical mix), less the value of the gap it fills. So a 0.47 share closes a 0.53 gap (0.06
        idle) but opens a fresh GPU rather than leave 0.21 beside a 0.32 that a 0.65 would have filled;
      - the gaps and whole GPUs its CPUs and memory close off: those no typical shape could use any more,
        and the GPU the node's remaining CPUs could no longer feed at the mix's CPUs per GPU. So CPU-hungry
        work goes to nodes with CPUs to spare and CPU-light work to nodes short of them.
      One milli-GPU of expected idle capacity weighs as two points of FGD's score, so idle capacity decides
      and FGD's score only parts placements that cost the same.
    - GPU work pays, the same way, for the places it takes from work pinned to some GPU models, where pinned
      work needs much of the model (`models.model_pressure`, `_displaced`).
    - CPU-only work goes to the node with the least GPU free (FGD breaking ties), so the CPUs it takes do
      not strand GPUs that GPU work could still use: on CPU-heavy traces that is a point of the cluster.

    Measured on the Alibaba trace: see docs/performance.md.
    """

    name = "gpupool"
    ties = "order"

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        tables = ctx.memo.table("gap-waste")
        shapes = gpu_shapes(ctx.mix)
        if shapes not in tables:
            tables[shapes] = gap_waste(shapes)
        self.idle = ExpectedIdle(ctx.mix, tables[shapes], ctx.memo.table("expected-idle", ctx.mix))
        self.pressure = dict(ctx.model_pressure)

    def _scores_depend_on(self, ctx: PolicyContext) -> tuple[object, ...]:
        return (ctx.mix, tuple(sorted(ctx.model_pressure.items())))

    def _compute(self, node: NodeState, req: Request, pipelined: bool, models: frozenset[str], project: int) -> _Found:
        if not (req.gpus or req.gpu_milli or req.gpu_memory_mib):
            shares, value = super()._compute(node, req, pipelined, models, project)
            if shares is not None:
                value -= node.gpu_milli_free() * _GPU_FREE_STEP
            return shares, value
        best: _Found = (None, 0.0)
        before, options = self._options(node, req, pipelined, models, project)
        fragment, idle = self.fragment(*before), self.idle(*before)
        for shares, after in options:
            cost = self.idle(*after) - idle + self._displaced(node, shares)
            value = _score(fragment - self.fragment(*after)) - _GAP_WEIGHT * cost
            if best[0] is None or value > best[1]:
                best = (shares, value)
        return best

    def _displaced(self, node: NodeState, shares: tuple[DeviceShare, ...]) -> int:
        """Milli-GPU of model-pinned work expected to find its place taken by these shares. Where pinned
        work needs little of a model (`models.model_pressure`), the rest is room for anyone; the chance of
        displacing it then rises with the pressure, to certain where pinned work alone fills the model."""
        if not self.pressure:
            return 0
        out = 0
        for s in shares:
            p = min(MILLI, self.pressure.get(node.device(s.index).model, 0))
            if p > PINNED_ROOM:
                out += s.milli * (p - PINNED_ROOM) // (MILLI - PINNED_ROOM)
        return out


_GAP_WEIGHT = 2
"""Points of FGD's score per milli-GPU a share's gap is expected to leave idle. On the Alibaba trace 1 does
as well on most lists and 0.04 to 0.08 points worse on some; 2 and 4 do the same."""

PINNED_ROOM = 400
"""Per mille of a model's capacity that pinned work may need before unpinned work pays to use the model."""

_GPU_FREE_STEP = 1_000.0
"""For CPU-only work one milli-GPU free outweighs FGD's whole score range (0..100)."""


def _score(decrease: float) -> float:
    """FGD's score for a fragment decrease, with its simulator's integer truncation."""
    return float(int(100 / (1 + math.exp(-decrease / 1000))))


def _position(node: NodeState, index: int) -> int:
    for i, d in enumerate(node.devices):
        if d.index == index:
            return i
    raise KeyError(index)


register(FgdPolicy.name, FgdPolicy)
register(GpupoolPolicy.name, GpupoolPolicy)
