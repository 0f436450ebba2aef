"""Victim sets: lowest priority, then fewest workloads, then least work lost, then most recently started; the same
rule on one node, across nodes, and for gangs spanning nodes."""

import dataclasses

import pytest

from gpupool.core import MILLI, DeviceShare, Placement, SchedulerConfig, State
from gpupool.core.config import ALL_ACTIONS
from tests.core.builders import Cluster, Run


def timed(c: Cluster, wid: str, start: float, checkpoint: float | None = None) -> Cluster:
    """Workload `wid` started at `start` and last saved a checkpoint at `checkpoint` (None: never)."""
    c.workloads = [
        dataclasses.replace(w, start_time=start, checkpoint_time=checkpoint) if w.id == wid else w for w in c.workloads
    ]
    return c


def at(c: Cluster, now: float) -> Run:
    return Run(dataclasses.replace(c.snapshot(), now=now))


def gang_running(c: Cluster, wid: str, project: str, nodes: list[str], gpus: int, priority: str = "batch") -> Cluster:
    """A gang running one member of `gpus` whole GPUs (devices 0..gpus-1) on each of `nodes`."""
    c.submit(wid, project, gpus=gpus, workers=len(nodes), priority=priority)
    w = c.workloads[-1]
    memory = next(n for n in c.nodes if n.name == nodes[0]).devices[0].memory_mib
    shares = tuple(DeviceShare(i, MILLI, memory) for i in range(gpus))
    placements = tuple(Placement(m, node, shares) for m, node in enumerate(nodes))
    c.workloads[-1] = dataclasses.replace(w, state=State.RUNNING, placements=placements, start_time=c.now)
    return c


def evicted_by(run: Run, wid: str, priority: str = "training", **request: float) -> list[str]:
    """Submit `wid` to project a (`request`: the builder's gpus, gpu, cpus, workers) and run one cycle."""
    run.submit(Cluster(), wid, "a", priority=priority, **request)  # the builder only makes the workload
    return sorted(e.workload for e in run.cycle().evictions)


def big_and_two_small(across: bool, big: str = "batch") -> Cluster:
    """A 2-GPU workload ("big", of class `big`) and two 1-GPU batch ones started after it ("s1", "s2"): on one
    4-GPU node, or the big one alone on the second of two 2-GPU nodes."""
    c = Cluster().pool("h100", nodes=2 if across else 1, gpus=2 if across else 4).project("a", deserved=4)
    c.running("big", "a", "h100-1" if across else "h100-0", [0, 1], gpus=2, priority=big)
    c.running("s1", "a", "h100-0", [0 if across else 2], gpus=1, priority="batch")
    return c.running("s2", "a", "h100-0", [1 if across else 3], gpus=1, priority="batch")


@pytest.mark.parametrize("across", [False, True], ids=["one node", "across nodes"])
def test_one_two_gpu_victim_is_preferred_to_two_one_gpu_victims(across: bool) -> None:
    # The small ones started last and lose less work, but two evictions are worse than one.
    run = Run(big_and_two_small(across).snapshot())
    assert evicted_by(run, "t", gpus=2) == ["big"]
    run.settle()
    assert run.running() == {"s1", "s2", "t"}


def test_lower_priority_comes_before_fewer_victims() -> None:
    run = Run(big_and_two_small(across=False, big="interactive").snapshot())
    assert evicted_by(run, "serve", gpus=2, priority="production") == ["s1", "s2"]


def test_work_lost_counts_gpus_as_well_as_time() -> None:
    # The 2-GPU victim started later, but its 2 GPU x 60 s lose more than the 1 GPU x 100 s of the older one.
    c = Cluster().pool("h100", nodes=1, gpus=4).project("a", deserved=4)
    c.running("wide", "a", "h100-0", [0, 1], gpus=2, priority="batch")
    c.running("narrow", "a", "h100-0", [2], gpus=1, priority="batch")
    c.running("keep", "a", "h100-0", [3], gpus=1, priority="production", preemptible=False)
    timed(timed(c, "wide", 40.0), "narrow", 0.0)
    run = at(c, 100.0)
    assert evicted_by(run, "t", gpus=1) == ["narrow"]


def test_a_half_gpu_member_takes_one_half_gpu_victim_rather_than_two_quarters() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=2).project("a", deserved=2)
    c.running("half", "a", "h100-0", [0], gpu=0.5, priority="batch")
    c.running("keep0", "a", "h100-0", [0], gpu=0.5, priority="production", preemptible=False)
    c.running("q1", "a", "h100-0", [1], gpu=0.25, priority="batch")
    c.running("q2", "a", "h100-0", [1], gpu=0.25, priority="batch")
    c.running("keep1", "a", "h100-0", [1], gpu=0.5, priority="production", preemptible=False)
    assert evicted_by(Run(c.snapshot()), "t", gpu=0.5) == ["half"]


def test_a_node_short_of_cpu_too_gives_up_a_cpu_only_victim_rather_than_a_second_gpu_one() -> None:
    # Taking both GPU workloads frees the CPU too, but the CPU-only one has no GPU work to lose.
    c = Cluster().pool("h100", nodes=1, gpus=2, cpus=16).project("a", deserved=2)
    c.running("cpu", "a", "h100-0", [], cpus=8, priority="batch")
    c.running("g1", "a", "h100-0", [0], gpus=1, cpus=4, priority="batch")
    c.running("g2", "a", "h100-0", [1], gpus=1, cpus=4, priority="batch")
    run = at(timed(timed(timed(c, "cpu", 0.0), "g1", 10.0), "g2", 20.0), 100.0)
    assert evicted_by(run, "t", gpus=1, cpus=8) == ["cpu", "g2"]


def pair(across: bool, a: str, b: str) -> Cluster:
    """Two 1-GPU batch workloads of project a, `a` started first: on one 2-GPU node, or each alone on a 1-GPU
    node with `b` on the first node (so that node order alone would pick it)."""
    c = Cluster().pool("h100", nodes=2 if across else 1, gpus=1 if across else 2).project("a", deserved=2)
    c.running(a, "a", "h100-1" if across else "h100-0", [0], gpus=1, priority="batch")
    return c.running(b, "a", "h100-0", [0 if across else 1], gpus=1, priority="batch")


@pytest.mark.parametrize("across", [False, True], ids=["one node", "across nodes"])
def test_equal_counts_evict_the_one_losing_least_work_since_its_checkpoint(across: bool) -> None:
    # "saved" started first but checkpointed a second ago; "unsaved" started later and never checkpointed.
    c = pair(across, "saved", "unsaved")
    run = at(timed(timed(c, "saved", 0.0, checkpoint=99.0), "unsaved", 10.0), 100.0)
    assert evicted_by(run, "t", gpus=1) == ["saved"]


@pytest.mark.parametrize("across", [False, True], ids=["one node", "across nodes"])
def test_equal_work_lost_evicts_the_most_recently_started(across: bool) -> None:
    # Both lose 1 GPU x 50 s: "first" checkpointed at 50, when "second" started.
    c = pair(across, "first", "second")
    run = at(timed(timed(c, "first", 0.0, checkpoint=50.0), "second", 50.0), 100.0)
    assert evicted_by(run, "t", gpus=1) == ["second"]


@pytest.mark.parametrize(("across", "victim"), [(False, "x1"), (True, "x2")], ids=["one node", "across nodes"])
def test_full_ties_keep_the_order_used_before_the_rule(across: bool, victim: str) -> None:
    # On a node the lowest id; across nodes the first node (x2's), as before work lost counted.
    c = pair(across, "x1", "x2")
    run = at(timed(timed(c, "x1", 1.0), "x2", 1.0), 10.0)
    assert evicted_by(run, "t", gpus=1) == [victim]


# -- gangs ------------------------------------------------------------------------------------------


def test_a_victim_gang_loses_the_work_of_all_its_members() -> None:
    # The gang started later than "solo", but 2 x 4 GPU since then is more work than 4 GPU since solo began.
    c = Cluster().pool("h100", nodes=3, gpus=4).project("a", deserved=12)
    c.running("solo", "a", "h100-2", [0, 1, 2, 3], gpus=4, priority="batch")
    gang_running(c, "gang", "a", ["h100-0", "h100-1"], gpus=4)
    run = at(timed(timed(c, "solo", 0.0), "gang", 40.0), 100.0)
    assert evicted_by(run, "t", gpus=4) == ["solo"]


def test_a_gang_takes_one_victim_gang_rather_than_a_cheaper_victim_and_the_gang_too() -> None:
    # "solo" loses least, but a 2-node gang preemptor would still need the victim gang's second node:
    # evicting the victim gang alone makes room for both members.
    c = Cluster().pool("h100", nodes=3, gpus=4).project("a", deserved=12)
    gang_running(c, "gang", "a", ["h100-0", "h100-1"], gpus=4)
    c.running("solo", "a", "h100-2", [0, 1, 2, 3], gpus=4, priority="batch")
    run = at(timed(timed(c, "gang", 0.0), "solo", 50.0), 100.0)
    assert evicted_by(run, "dist", gpus=4, workers=2) == ["gang"]
    run.settle()
    assert run.running() == {"dist", "solo"}


def test_a_gang_takes_one_victim_whose_node_holds_two_of_its_members() -> None:
    # x and y lose least one at a time, but the gang would need both; z's node takes both members.
    c = Cluster().pool("h100", nodes=3, gpus=8).project("a", deserved=24)
    c.running("z", "a", "h100-0", range(8), gpus=8, priority="batch")
    c.running("x", "a", "h100-1", range(4), gpus=4, priority="batch")
    c.running("keep1", "a", "h100-1", range(4, 8), gpus=4, priority="production", preemptible=False)
    c.running("y", "a", "h100-2", range(4), gpus=4, priority="batch")
    c.running("keep2", "a", "h100-2", range(4, 8), gpus=4, priority="production", preemptible=False)
    run = at(timed(timed(timed(c, "z", 0.0), "x", 50.0), "y", 50.0), 100.0)
    assert evicted_by(run, "dist", gpus=4, workers=2) == ["z"]
    run.settle()
    assert {p.node for p in run.workload("dist").placements} == {"h100-0"}


def test_reclaim_takes_one_two_gpu_borrower_rather_than_two_one_gpu_ones() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=8).project("a", deserved=4).project("b", deserved=4)
    for i in range(4):
        c.running(f"b{i}", "b", "h100-0", [i], gpus=1)
    c.running("b-wide", "b", "h100-0", [4, 5], gpus=2)
    c.running("b5", "b", "h100-0", [6], gpus=1).running("b6", "b", "h100-0", [7], gpus=1)
    run = Run(c.snapshot())
    run.submit(c, "a0", "a", gpus=2)
    d = run.cycle()
    assert [(e.workload, e.reason.value) for e in d.evictions] == [("b-wide", "reclaim")]


def test_consolidation_moves_the_workload_losing_least_work() -> None:
    c = Cluster().pool("h100", nodes=2, gpus=4).project("a", deserved=8)
    c.running("x", "a", "h100-0", [0, 1], gpus=2).running("y", "a", "h100-1", [0, 1], gpus=2)
    timed(timed(c, "x", 50.0), "y", 0.0, checkpoint=90.0)  # y started first, but saved its work at 90
    run = Run(dataclasses.replace(c.snapshot(), now=100.0), SchedulerConfig(actions=ALL_ACTIONS))
    run.submit(c, "z", "a", gpus=4)
    assert [(e.workload, e.reason.value) for e in run.cycle().evictions] == [("y", "consolidate")]
    run.settle()
    assert [run.workload(w).placements[0].node for w in ("x", "y", "z")] == ["h100-0", "h100-0", "h100-1"]
