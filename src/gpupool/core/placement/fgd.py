"""Fragmentation-gradient placement (FGD, USENIX ATC'23) and gpupool's default policy built on it.

A node's fragmentation is the GPU capacity (milli) that the typical workload mix could not use there,
weighted by each typical shape's popularity. FGD places a request where it grows that figure least.
"""

from __future__ import annotations

from gpupool.core.model import MILLI, DeviceShare, Request
from gpupool.core.placement.devices import free_whole_devices, share_candidates, whole_shares
from gpupool.core.placement.policies import Policy, PolicyContext, register
from gpupool.core.state import NodeState

Shape = tuple[int, int, int, int, int]
_Found = tuple[tuple[DeviceShare, ...] | None, float]


def shape_of(req: Request) -> Shape:
    return (req.gpus, req.gpu_milli, req.gpu_memory_mib, req.cpu_milli, req.memory_mib)


def typical_fragment(free: list[int], cpu_free: int, mem_free: int, mem_per_device: int, t: Request) -> int:
    """Idle milli-GPU on one node that a workload of shape `t` could not use."""
    idle = sum(free)
    if idle == 0:
        return 0
    host_fits = t.cpu_milli <= cpu_free and t.memory_mib <= mem_free
    if t.gpus == 0 and t.gpu_milli == 0 and t.gpu_memory_mib == 0:
        return 0 if host_fits else idle
    if not host_fits:
        return idle
    if t.gpus:
        if sum(1 for f in free if f == MILLI) >= t.gpus:
            return sum(f for f in free if f < MILLI)
        return idle
    need = t.gpu_milli or min(MILLI, -(-t.gpu_memory_mib * MILLI // max(1, mem_per_device)))
    if any(f >= need for f in free):
        return sum(f for f in free if f < need)
    return idle


class FgdPolicy(Policy):
    name = "fgd"

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        total = sum(w for _, w in ctx.mix) or 1
        self._mix = ctx.mix
        self._total_weight = total
        self._cache: dict[tuple[int, Request, bool, frozenset[str]], _Found] = ctx.memo.table(self.name, ctx.mix)
        """By node signature: nodes in identical states share their evaluations."""

    def node_fragment(self, free: list[int], cpu_free: int, mem_free: int, mem_per_device: int) -> float:
        frag = 0
        for t, w in self._mix:
            frag += w * typical_fragment(free, cpu_free, mem_free, mem_per_device, t)
        return frag / self._total_weight

    def _evaluate(self, node: NodeState, req: Request, pipelined: bool, models: frozenset[str]) -> _Found:
        if node.signature < 0:
            return self._compute(node, req, pipelined, models)
        key = (node.signature, req, pipelined, models)
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = self._compute(node, req, pipelined, models)
        return found

    def _compute(self, node: NodeState, req: Request, pipelined: bool, models: frozenset[str]) -> _Found:
        free = [d.free_milli() for d in node.devices]
        cpu_free = node.cpu - node.used_cpu - node.rel_cpu
        mem_free = node.memory - node.used_memory - node.rel_memory
        mem_dev = node.devices[0].memory if node.devices else 0
        before = self.node_fragment(free, cpu_free, mem_free, mem_dev)
        cpu_after, mem_after = cpu_free - req.cpu_milli, mem_free - req.memory_mib
        if req.gpus:
            devices = free_whole_devices(node, pipelined, models)
            if len(devices) < req.gpus:
                return None, 0.0
            shares = whole_shares(devices[: req.gpus])
            after = list(free)
            for s in shares:
                after[_position(node, s.index)] = 0
            return shares, before - self.node_fragment(after, cpu_after, mem_after, mem_dev)
        if req.gpu_milli or req.gpu_memory_mib:
            best: tuple[float, int, DeviceShare] | None = None
            for d, milli, mem in share_candidates(node, req, pipelined, models):
                after = list(free)
                pos = _position(node, d.index)
                after[pos] = max(0, after[pos] - milli)
                delta = before - self.node_fragment(after, cpu_after, mem_after, mem_dev)
                key = (-delta, d.index, DeviceShare(d.index, milli, mem))
                if best is None or key[:2] < best[:2]:
                    best = key
            if best is None:
                return None, 0.0
            return (best[2],), -best[0]
        return (), before - self.node_fragment(free, cpu_after, mem_after, mem_dev)

    def evaluate(
        self, node: NodeState, req: Request, pipelined: bool, models: frozenset[str]
    ) -> tuple[tuple[DeviceShare, ...], float] | None:
        shares, value = self._evaluate(node, req, pipelined, models)
        return None if shares is None else (shares, value)


class GpupoolPolicy(FgdPolicy):
    """The default. Whole GPUs pack: the node left with the fewest free whole GPUs wins, which keeps whole
    GPUs free elsewhere, and the fragmentation gradient breaks ties. Fractions go where fragmentation grows
    least, fuller nodes breaking near-ties."""

    name = "gpupool"

    def _compute(self, node: NodeState, req: Request, pipelined: bool, models: frozenset[str]) -> _Found:
        shares, value = super()._compute(node, req, pipelined, models)
        if shares is None:
            return shares, value
        if req.gpus:
            left = node.free_whole(pipelined) - req.gpus
            return shares, -float(left) * _WHOLE_GPU_WEIGHT + value
        total = len(node.devices) * MILLI or 1
        return shares, value + 0.001 * (1.0 - node.gpu_milli_free() / total)


_WHOLE_GPU_WEIGHT = 1e6
"""Larger than any fragmentation delta (milli-GPU of one node), so GPU packing decides first."""


def _position(node: NodeState, index: int) -> int:
    for i, d in enumerate(node.devices):
        if d.index == index:
            return i
    raise KeyError(index)


register(FgdPolicy.name, FgdPolicy)
register(GpupoolPolicy.name, GpupoolPolicy)
