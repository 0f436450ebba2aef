"""Placement scoring policies, chosen by name so the simulator can compare them.

A policy picks the devices of one node for one member (`choose`) and scores that choice (`score`,
higher is better). The placer breaks score ties by node order, so every policy is deterministic.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from gpupool.core.model import MILLI, DeviceShare, Request
from gpupool.core.placement.devices import free_whole_devices, share_candidates, whole_shares
from gpupool.core.placement.memo import Memo
from gpupool.core.state import NodeState

TypicalMix = tuple[tuple[Request, int], ...]
"""Typical request shapes with their popularity weights (for fragmentation-aware scoring)."""


@dataclass(frozen=True)
class PolicyContext:
    mix: TypicalMix
    seed: int
    max_cpu: int
    max_gpus: int
    memo: Memo


class Policy:
    """Packing for whole GPUs, best-fit device for shares. Subclasses override what they change."""

    name = "base"
    state_only = True
    """Scores depend on the node's state alone, so nodes in identical states need scoring only once."""

    def __init__(self, ctx: PolicyContext) -> None:
        self.ctx = ctx

    def choose(
        self, node: NodeState, req: Request, pipelined: bool, models: frozenset[str]
    ) -> tuple[DeviceShare, ...] | None:
        if req.gpus:
            free = free_whole_devices(node, pipelined, models)
            if len(free) < req.gpus:
                return None
            return whole_shares(free[: req.gpus])
        if req.gpu_milli or req.gpu_memory_mib:
            best: tuple[int, int, int, int] | None = None
            for d, milli, mem in share_candidates(node, req, pipelined, models):
                key = (-(d.used + d.rel), d.index, milli, mem)  # fullest device that still fits
                if best is None or key < best:
                    best = key
            if best is None:
                return None
            return (DeviceShare(best[1], best[2], best[3]),)
        return ()

    def score(self, node: NodeState, req: Request, shares: tuple[DeviceShare, ...]) -> float:
        return 0.0

    def evaluate(
        self, node: NodeState, req: Request, pipelined: bool, models: frozenset[str]
    ) -> tuple[tuple[DeviceShare, ...], float] | None:
        """The devices this policy would use on `node` and its score there, or None if it does not fit."""
        shares = self.choose(node, req, pipelined, models)
        if shares is None:
            return None
        return shares, self.score(node, req, shares)


class RandomPolicy(Policy):
    name = "random"
    state_only = False

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self._rng = random.Random(ctx.seed)

    def score(self, node: NodeState, req: Request, shares: tuple[DeviceShare, ...]) -> float:
        return self._rng.random()


class PackingPolicy(Policy):
    """GpuPacking: already-shared devices first, then partly used nodes, then idle nodes."""

    name = "packing"

    def score(self, node: NodeState, req: Request, shares: tuple[DeviceShare, ...]) -> float:
        free_milli = node.gpu_milli_free()
        total = len(node.devices) * MILLI
        if req.gpus:
            # Fewest free GPUs left after placement: keeps whole GPUs free elsewhere.
            return -float(node.free_whole(False) - req.gpus) - free_milli / (total * 10 + 1)
        if shares:
            d = node.device(shares[0].index)
            shared = 0 < d.used + d.rel < MILLI
            tier = 2 if shared else (1 if free_milli < total else 0)
            return tier * 10 + (1 - (MILLI - d.used - d.rel) / MILLI)
        return -free_milli / (total + 1)


class BestFitPolicy(Policy):
    """Least leftover CPU and GPU after placement, each normalised by the largest node."""

    name = "bestfit"

    def score(self, node: NodeState, req: Request, shares: tuple[DeviceShare, ...]) -> float:
        cpu_left = (node.cpu - node.used_cpu - node.rel_cpu - req.cpu_milli) / max(1, self.ctx.max_cpu)
        gpu_left = (node.gpu_milli_free() - sum(s.milli for s in shares)) / max(1, self.ctx.max_gpus * MILLI)
        return -(0.5 * cpu_left + 0.5 * gpu_left)


class DotProductPolicy(Policy):
    """Tetris-style alignment of the request with the node's free resources."""

    name = "dotprod"

    def score(self, node: NodeState, req: Request, shares: tuple[DeviceShare, ...]) -> float:
        cpu_free = (node.cpu - node.used_cpu - node.rel_cpu) / max(1, self.ctx.max_cpu)
        gpu_free = node.gpu_milli_free() / max(1, self.ctx.max_gpus * MILLI)
        cpu_req = req.cpu_milli / max(1, self.ctx.max_cpu)
        gpu_req = sum(s.milli for s in shares) / max(1, self.ctx.max_gpus * MILLI)
        return -(cpu_free * cpu_req + gpu_free * gpu_req)


class ClusteringPolicy(Policy):
    """GpuClustering: nodes already hosting the same GPU-request size, then idle nodes, then mixed."""

    name = "clustering"

    def score(self, node: NodeState, req: Request, shares: tuple[DeviceShare, ...]) -> float:
        want = sum(s.milli for s in shares)
        sizes = {d.used for d in node.devices if d.used and not d.whole}
        whole_used = sum(1 for d in node.devices if d.whole)
        same = (whole_used > 0 and not sizes) if req.gpus else sizes == {want}
        idle = not sizes and whole_used == 0
        return 2.0 if same else (1.0 if idle else 0.0)


PolicyFactory = Callable[[PolicyContext], Policy]

_REGISTRY: dict[str, PolicyFactory] = {}


def register(name: str, factory: PolicyFactory) -> None:
    _REGISTRY[name] = factory


def make_policy(name: str, ctx: PolicyContext) -> Policy:
    try:
        return _REGISTRY[name](ctx)
    except KeyError:
        raise ValueError(f"unknown placement policy {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def policy_names() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


for _cls in (RandomPolicy, PackingPolicy, BestFitPolicy, DotProductPolicy, ClusteringPolicy):
    register(_cls.name, _cls)
