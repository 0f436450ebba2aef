"""Consolidation (opt-in): move preemptible work so a workload that fits nowhere can start."""

from gpupool.core import SchedulerConfig
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
