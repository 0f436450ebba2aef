"""Gangs: all members or none, on the fewest nodes, torn down when members are lost."""

import dataclasses

from gpupool.core import State
from tests.core.builders import Cluster, Run


def test_gang_is_placed_whole_on_the_fewest_nodes() -> None:
    c = Cluster().pool("h100", nodes=3, gpus=8).project("a", deserved=24)
    c.submit("ddp", "a", gpus=2, workers=4)
    run = Run(c.snapshot()).settle()
    placements = run.workload("ddp").placements
    assert len(placements) == 4
    assert len({p.node for p in placements}) == 1
    assert all(len(p.devices) == 2 for p in placements)


def test_gang_that_cannot_be_placed_whole_takes_nothing() -> None:
    c = Cluster().pool("h100", nodes=2, gpus=4).project("a", deserved=8)
    c.submit("busy", "a", gpus=3).submit("ddp", "a", gpus=2, workers=3)
    run = Run(c.snapshot()).settle()
    assert run.running() == {"busy"}
    assert run.workload("ddp").placements == ()
    assert run.reason("ddp") == "gang-unplaceable"


def test_multi_gpu_members_use_devices_of_one_node() -> None:
    c = Cluster().pool("h100", nodes=4, gpus=4).project("a", deserved=16)
    c.submit("ddp", "a", gpus=4, workers=3)
    run = Run(c.snapshot()).settle()
    placements = run.workload("ddp").placements
    assert len({p.node for p in placements}) == 3
    assert all(len({d.index for d in p.devices}) == 4 for p in placements)


def test_gang_that_lost_a_member_is_torn_down() -> None:
    c = Cluster().pool("h100", nodes=2, gpus=4).project("a", deserved=8)
    c.submit("ddp", "a", gpus=4, workers=2)
    run = Run(c.snapshot()).settle()
    lost = run.workload("ddp").placements[0].node
    snap = run.snapshot
    run.snapshot = dataclasses.replace(snap, nodes=tuple(n for n in snap.nodes if n.name != lost))
    d = run.cycle()
    assert [(e.workload, e.reason.value) for e in d.evictions] == [("ddp", "gang-broken")]
    assert run.workload("ddp").state is State.PENDING


def test_gang_preempts_as_one() -> None:
    c = Cluster().pool("h100", nodes=2, gpus=2).project("a", deserved=4)
    for i in range(4):
        c.submit(f"s{i}", "a", gpus=1, priority="batch")
    run = Run(c.snapshot()).settle()
    run.submit(c, "ddp", "a", gpus=2, workers=2, priority="training")
    run.settle()
    assert run.running() == {"ddp"}
    assert sorted(run.evicted()) == ["s0", "s1", "s2", "s3"]
