"""The placement policy interface and registry: policies are chosen by name so the simulator can compare them.

A policy picks the devices of one node for one member of a project's workload (`choose`) and scores that
choice (`score`, higher is better), or does both at once (`evaluate`). The project matters only for shares
in pools that do not share devices across projects (`DeviceState.admits`). Among the best-scoring nodes
the placer takes the one its `ties` rule names; the random ones are drawn from the config seed, so a
snapshot's decision is fixed either way.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpupool.core.model import MILLI, DeviceShare, Request
from gpupool.core.placement.devices import free_whole_devices, share_candidates, whole_shares
from gpupool.core.placement.memo import Memo
from gpupool.core.state import NodeState

TypicalMix = tuple[tuple[Request, int], ...]
"""Typical request shapes with their popularity weights (for fragmentation-aware scoring)."""


def popular_shapes(requests: Iterable[Request], coverage_pct: int) -> TypicalMix:
    """FGD's typical pods: shapes by count, most popular first (ties: the larger shape first, as FGD's
    simulator orders them) until `coverage_pct` of the requests is covered, the crossing shape included."""
    counts = Counter(requests)
    total = sum(counts.values())
    ranked = sorted(
        counts.items(),
        key=lambda kv: (
            -kv[1],
            -kv[0].cpu_milli,
            -(kv[0].gpu_milli or MILLI * (kv[0].gpus > 0)),
            -kv[0].gpus,
            -kv[0].gpu_memory_mib,
            -kv[0].memory_mib,
        ),
    )
    mix: list[tuple[Request, int]] = []
    covered = 0
    for req, n in ranked:
        mix.append((req, n))
        covered += n
        if covered * 100 >= coverage_pct * total:
            break
    return tuple(mix)


@dataclass(frozen=True)
class PolicyContext:
    mix: TypicalMix
    seed: int
    max_cpu: int
    max_gpus: int
    memo: Memo
    requests_on: Callable[[NodeState], Sequence[Request]] = lambda node: ()
    """The requests of the members resident on a node (for policies that look at what runs there)."""
    model_pressure: Mapping[str, int] = field(default_factory=dict)
    """Per GPU model, the per mille of its capacity that work pinned to some models needs (`models.py`)."""


class Policy:
    """Packing for whole GPUs, best-fit device for shares. Subclasses override what they change."""

    name = "base"
    state_only = True
    """Scores depend on the node's state alone, so nodes in identical states need scoring only once."""
    ties = "lowest"
    """Among equal best scores: "lowest" node index; "order", the first in a fixed node order drawn from the
    seed (how the FGD simulator's baselines behave); "random", any, drawn per workload from the seed."""

    def __init__(self, ctx: PolicyContext) -> None:
        self.ctx = ctx

    def choose(
        self, node: NodeState, req: Request, pipelined: bool, models: frozenset[str], project: int
    ) -> tuple[DeviceShare, ...] | None:
        if req.gpus:
            free = free_whole_devices(node, pipelined, models)
            if len(free) < req.gpus:
                return None
            return whole_shares(free[: req.gpus])
        if req.gpu_milli or req.gpu_memory_mib:
            best: tuple[int, int, int, int] | None = None
            for d, milli, mem in share_candidates(node, req, pipelined, models, project):
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
        self, node: NodeState, req: Request, pipelined: bool, models: frozenset[str], project: int
    ) -> tuple[tuple[DeviceShare, ...], float] | None:
        """The devices this policy would use on `node` for a member of `project`, and its score there, or
        None if it does not fit."""
        shares = self.choose(node, req, pipelined, models, project)
        if shares is None:
            return None
        return shares, self.score(node, req, shares)

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
        """The devices actually used on the chosen node (a policy may pick among equals at random)."""
        return shares


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
