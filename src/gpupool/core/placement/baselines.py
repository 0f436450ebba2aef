"""The published baseline policies of the FGD paper (ATC'23), as its simulator scores them.

Scores are the simulator's integers (0..100), truncated where it truncates, so nodes tie where they tied
there. Ties go to the first node in a fixed order drawn from the seed: measured against the authors'
published results, that is how their runs behave (picking uniformly at random among ties, as stock
kube-scheduler does, leaves 2-5 points more GPUs unallocated for packing, clustering and FGD). Device
choice follows its `best` rule (the fullest device that fits, lowest index first) except Random, which picks
any fitting device.
Normalisation constants are the simulator's: 128 cores and 8 GPUs.
"""

from __future__ import annotations

import random

from gpupool.core.model import MILLI, DeviceShare, Request
from gpupool.core.placement.devices import share_candidates
from gpupool.core.placement.policies import Policy, PolicyContext, register
from gpupool.core.state import NodeState

_Found = tuple[tuple[DeviceShare, ...], float] | None

MAX_CPU = 128_000
MAX_GPU = 8 * MILLI


def cpu_left(node: NodeState) -> int:
    return node.cpu - node.used_cpu - node.rel_cpu


def gpu_left(node: NodeState) -> int:
    return node.gpu_milli_free()


def asked(req: Request, shares: tuple[DeviceShare, ...]) -> int:
    return sum(s.milli for s in shares)


class RandomPolicy(Policy):
    """Any feasible node, any device that fits."""

    name = "random"
    ties = "random"

    def finalize(
        self,
        node: NodeState,
        req: Request,
        shares: tuple[DeviceShare, ...],
        pipelined: bool,
        models: frozenset[str],
        project: int,
        rng: random.Random,
    ) -> tuple[DeviceShare, ...]:
        if req.gpus or not shares:
            return shares
        options = [
            DeviceShare(d.index, m, mem) for d, m, mem in share_candidates(node, req, pipelined, models, project)
        ]
        return (options[rng.randrange(len(options))],) if options else shares


class DotProductPolicy(Policy):
    """Tetris: the smaller the dot product of free resources and request, the higher the score."""

    name = "dotprod"
    ties = "order"

    def score(self, node: NodeState, req: Request, shares: tuple[DeviceShare, ...]) -> float:
        left = cpu_left(node)
        if left < req.cpu_milli:
            return 0
        dot = (left / MAX_CPU * req.cpu_milli / MAX_CPU + gpu_left(node) / MAX_GPU * asked(req, shares) / MAX_GPU) / 2
        return int(100 * (1 - dot))


class ClusteringPolicy(Policy):
    """GpuClustering: nodes that hold only this kind of GPU request, then mixed ones, then idle ones."""

    name = "clustering"
    ties = "order"
    state_only = False  # it looks at the kinds of work on a node, which its device state does not show

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self._found: dict[tuple[int, int, Request, bool, frozenset[str], tuple[bool, ...] | None], _Found] = {}
        """By node and its version within this cycle: a cycle's requests mostly repeat a few shapes, and
        each placement changes one node, so most evaluations were made already."""

    def evaluate(
        self, node: NodeState, req: Request, pipelined: bool, models: frozenset[str], project: int
    ) -> tuple[tuple[DeviceShare, ...], float] | None:
        key = (node.idx, node.version, req, pipelined, models, node.admission(req, project, pipelined))
        if key not in self._found:
            self._found[key] = super().evaluate(node, req, pipelined, models, project)
        return self._found[key]

    def score(self, node: NodeState, req: Request, shares: tuple[DeviceShare, ...]) -> float:
        if not (req.gpus or req.gpu_milli or req.gpu_memory_mib):
            return 0
        tag = _tag(req)
        tags = {_tag(r) for r in self.ctx.requests_on(node) if r.gpus or r.gpu_milli or r.gpu_memory_mib}
        base = 25 * (MAX_GPU - gpu_left(node)) // MAX_GPU
        if tags == {tag}:
            return base + 75
        if tag in tags:
            return base + 50
        return base + (25 if not tags else 0)


class PackingPolicy(Policy):
    """GpuPacking: shared devices with the least left first, then partly used nodes, then idle nodes."""

    name = "packing"
    ties = "order"

    def score(self, node: NodeState, req: Request, shares: tuple[DeviceShare, ...]) -> float:
        if not shares:
            return 0
        free = [d.free_milli() for d in node.devices]
        count = len(free)
        if all(f == MILLI for f in free):
            return max(33 - count, count)
        need = req.gpus or 1
        milli = MILLI if req.gpus else shares[0].milli
        taken = [f for f in sorted(free) if f >= milli][:need]
        whole = sum(1 for f in taken if f == MILLI)
        if whole:
            return max(50 - whole, 33)
        return max(100 - sum(f * 100 // MILLI for f in taken) // 10, 50)


class BestFitPolicy(Policy):
    """Least CPU and GPU left after placement, each normalised by the largest node spec."""

    name = "bestfit"
    ties = "order"

    def score(self, node: NodeState, req: Request, shares: tuple[DeviceShare, ...]) -> float:
        rest = 0.5 * (cpu_left(node) - req.cpu_milli) / MAX_CPU + 0.5 * (gpu_left(node) - asked(req, shares)) / MAX_GPU
        return int((1 - rest) * 100)


def _tag(req: Request) -> str:
    return f"{req.gpus}-gpu" if req.gpus else "share-gpu"


for _cls in (RandomPolicy, DotProductPolicy, ClusteringPolicy, PackingPolicy, BestFitPolicy):
    register(_cls.name, _cls)
