"""Consolidation (opt-in): move preemptible work so a workload that fits nowhere can start."""

import dataclasses

from gpupool.core import Placement, SchedulerConfig
from gpupool.core.config import ALL_ACTIONS
from tests.core.builders import Cluster, Run


def test_consolidation_moves_a_workload_to_make_room() -> None:
    c = Cluster().pool("h100", nodes=2, gpus=4).project("a", deserved=8)
    c.running("x", "a", "h100-0", [0, 1], gpus=2).running("y", "a", "h100-1", [0, 1], gpus=2)
    c.submit("z", "a", gpus=4)  # 4 GPUs free in all, but 2 on each node
    run = Run(c.snapshot(), SchedulerConfig(actions=ALL_ACTIONS))
    first = run.cycle()
    # y started last: moving it loses the least work
    assert [(e.workload, e.reason.value, e.preemptor) for e in first.evictions] == [("y", "consolidate", "z")]
    run.settle()
    assert run.running() == {"x", "y", "z"}
    assert {run.workload(w).placements[0].node for w in ("x", "y")} == {"h100-0"}


def test_consolidation_is_off_by_default() -> None:
    c = Cluster().pool("h100", nodes=2, gpus=4).project("a", deserved=8)
    run = Run(c.snapshot())
    run.submit(c, "x", "a", gpus=3).settle()
    run.submit(c, "y", "a", gpus=2).settle()
    run.submit(c, "z", "a", gpus=3).settle()
    assert "z" in run.pending() and run.evicted() == []


def gang_cluster(spare_nodes: int = 2) -> Cluster:
    """A gang g of two 2-GPU members on h100-0 and h100-1, production work beside it on h100-0 and on each spare
    node, 2 GPUs free on h100-1 and on each spare: z (4 GPUs) fits nowhere unless g moves off h100-1."""
    c = Cluster().pool("h100", nodes=2 + spare_nodes, gpus=4).project("a", deserved=16)
    c.running("g", "a", "h100-0", [0, 1], gpus=2, workers=2)
    g = c.workloads[-1]
    c.workloads[-1] = dataclasses.replace(
        g, placements=(g.placements[0], Placement(1, "h100-1", g.placements[0].devices))
    )
    c.running("p0", "a", "h100-0", [2, 3], gpus=2, priority="production")
    for i in range(2, 2 + spare_nodes):
        c.running(f"p{i}", "a", f"h100-{i}", [0, 1], gpus=2, priority="production")
    return c


def test_a_gang_moves_whole_to_free_a_node() -> None:
    c = gang_cluster()
    c.submit("z", "a", gpus=4)
    run = Run(c.snapshot(), SchedulerConfig(actions=ALL_ACTIONS))
    first = run.cycle()
    assert [(e.workload, e.reason.value, e.preemptor) for e in first.evictions] == [("g", "consolidate", "z")]
    assert "all 2 members together" in first.evictions[0].message
    run.settle()
    assert run.running() == {"g", "z", "p0", "p2", "p3"}
    assert run.workload("z").placements[0].node == "h100-1"
    # Checked against h100-2 and h100-3; once its GPUs on h100-0 are free, it packs back beside p0.
    assert {p.node for p in run.workload("g").placements} == {"h100-0", "h100-2"}


def test_a_gang_that_cannot_be_placed_elsewhere_at_once_stays() -> None:
    c = gang_cluster(spare_nodes=1)  # room for one member only: its own member's GPUs free only as it stops
    c.submit("z", "a", gpus=4)
    run = Run(c.snapshot(), SchedulerConfig(actions=ALL_ACTIONS)).settle()
    assert run.evicted() == [] and run.pending() == {"z"}


def test_a_gang_within_its_minimum_runtime_stays() -> None:
    c = gang_cluster()
    g = c.workloads[0]
    c.workloads[0] = dataclasses.replace(g, min_runtime_s=3600.0)
    c.submit("z", "a", gpus=4)
    run = Run(c.snapshot(), SchedulerConfig(actions=ALL_ACTIONS)).settle()
    assert run.evicted() == [] and run.pending() == {"z"}


def test_a_gang_counts_the_work_of_all_its_members() -> None:
    # s (2 GPUs) started a second before g, but g would lose the work of 4 GPUs: s moves, off h100-4.
    c = gang_cluster().pool("h100", nodes=1, gpus=4)
    c.running("s", "a", "h100-4", [0, 1], gpus=2)
    c.workloads[-1] = dataclasses.replace(c.workloads[-1], start_time=(c.workloads[0].start_time or 0) - 1)
    c.submit("z", "a", gpus=4)
    first = Run(c.snapshot(), SchedulerConfig(actions=ALL_ACTIONS)).cycle()
    assert [e.workload for e in first.evictions] == ["s"]
    assert [b.workload for b in first.binds] == [] and first.pending_for("z") is not None
