"""How a cycle runs: which actions, which placement policy, and the typical workload mix."""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.core.placement.models import ModelDemand
from gpupool.core.placement.policies import TypicalMix

ALL_ACTIONS: tuple[str, ...] = ("stale_gangs", "allocate", "reclaim", "preempt", "consolidate")


@dataclass(frozen=True)
class SchedulerConfig:
    policy: str = "gpupool"
    """Placement scoring policy by name: random, dotprod, clustering, packing, bestfit, fgd, gpupool."""
    actions: tuple[str, ...] = ("stale_gangs", "allocate", "reclaim", "preempt")
    """Consolidation moves running work, so it is opt-in: add "consolidate" to enable it."""
    typical_mix: TypicalMix | None = None
    """Request shapes with popularity weights for fragmentation scoring; None derives it from the snapshot."""
    model_demand: ModelDemand | None = None
    """GPU work by the models it accepts, for keeping unpinned work off models pinned work needs; None
    derives it from the snapshot's workloads."""
    mix_coverage_pct: int = 95
    """When derived, the most popular shapes that together cover this share of workloads."""
    seed: int = 0
    max_preemption_attempts: int = 100
    """Per action and cycle: bounds the cost of a cycle when much work waits on a full cluster."""
    victim_search_nodes: int = 8
    """Nodes on which a victim set is worked out per member before the cheapest is taken."""
    victim_visit_nodes: int = 128
    """Most nodes looked at for victims per member and attempt (a window that moves from cycle to cycle)."""
    max_move_attempts: int = 10
    """Per cycle: reclaims that may move work off a node for a project owed GPUs (0 turns moves off).
    Each such attempt searches for victims for the moved workloads too, so it costs several plain ones."""
    max_mixed_attempts: int = 8
    """Per cycle: preemptions that, having failed with the project's own work, try it mixed with other
    projects' borrowed work (0 turns them off). Each searches as a reclaim does; on a full cluster most fail, and
    39 of them took a quarter of the scale benchmark's steady cycle."""

    def __post_init__(self) -> None:
        unknown = [a for a in self.actions if a not in ALL_ACTIONS]
        if unknown:
            raise ValueError(f"unknown actions {unknown}; known: {', '.join(ALL_ACTIONS)}")
        if not 1 <= self.mix_coverage_pct <= 100:
            raise ValueError("mix_coverage_pct must be between 1 and 100")
        if self.max_move_attempts < 0 or self.max_mixed_attempts < 0:
            raise ValueError("max_move_attempts and max_mixed_attempts must not be negative")
