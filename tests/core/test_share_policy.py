"""Sharing a device across projects is a pool policy: by default a device's fractions are all one project's.

Each scenario runs with the pool's default (no sharing across projects) and, where the contrast says
something, with the pool allowing it.
"""

from __future__ import annotations

import dataclasses

from gpupool.core import PendingCode, SchedulerConfig, State
from tests.core.builders import Cluster, Run

WITH_CONSOLIDATE = SchedulerConfig(actions=("stale_gangs", "allocate", "reclaim", "preempt", "consolidate"))


def device(run: Run, wid: str) -> tuple[str, int]:
    p = run.workload(wid).placements[0]
    return p.node, p.devices[0].index


def two_projects(gpus: int = 2, nodes: int = 1, share: bool = False, owed: float = 0) -> Cluster:
    return (
        Cluster()
        .pool("gpu", nodes=nodes, gpus=gpus, share_across_projects=share)
        .project("a", deserved=owed)
        .project("b")
    )


# -- allocation ----------------------------------------------------------------------------------------------------


def test_by_default_two_projects_halves_go_to_different_devices() -> None:
    c = two_projects().submit("fa", "a", gpu=0.5).submit("fb", "b", gpu=0.5)
    run = Run(c.snapshot()).settle()
    assert run.running() == {"fa", "fb"}
    assert device(run, "fa") != device(run, "fb")


def test_a_pool_that_allows_it_packs_two_projects_halves_onto_one_device() -> None:
    c = two_projects(share=True).submit("fa", "a", gpu=0.5).submit("fb", "b", gpu=0.5)
    run = Run(c.snapshot()).settle()
    assert run.running() == {"fa", "fb"}
    assert device(run, "fa") == device(run, "fb")


def test_one_projects_halves_still_share_a_device() -> None:
    c = two_projects().submit("f1", "a", gpu=0.5).submit("f2", "a", gpu=0.5)
    run = Run(c.snapshot()).settle()
    assert device(run, "f1") == device(run, "f2")


def test_a_fraction_waits_with_its_own_reason_when_only_another_projects_device_has_room() -> None:
    c = two_projects(gpus=1).running("fb", "b", "gpu-0", [0], gpu=0.5).submit("fa", "a", gpu=0.5)
    run = Run(c.snapshot()).settle()
    assert run.running() == {"fb"}
    p = run.decisions[-1].pending_for("fa")
    assert p is not None
    assert p.code is PendingCode.NO_SHAREABLE_DEVICE
    assert p.message == (
        "the only devices in any pool with 0.5 of a GPU free are shared with other projects; "
        "pool gpu does not allow sharing a device across projects"
    )


def test_the_reason_names_gpu_memory_and_gang_members() -> None:
    c = two_projects(gpus=1, nodes=2).running("b0", "b", "gpu-0", [0], gpu=0.5)
    c.running("b1", "b", "gpu-1", [0], gpu=0.5).submit("g", "a", gpu_memory_gib=10, workers=2)
    d = Run(c.snapshot()).cycle()
    p = d.pending_for("g")
    assert p is not None
    assert (p.code, p.message) == (
        PendingCode.NO_SHAREABLE_DEVICE,
        "the only devices in any pool with 10240 MiB of GPU memory free for each of its 2 members are shared "
        "with other projects; pool gpu does not allow sharing a device across projects",
    )


def test_a_full_device_is_no_room_not_the_share_rule() -> None:
    c = two_projects(gpus=1).project("b", deserved=1)  # b keeps its device: nothing to reclaim
    c.running("fb", "b", "gpu-0", [0], gpu=0.75).submit("fa", "a", gpu=0.5)
    run = Run(c.snapshot()).settle()
    assert run.reason("fa") == "over-deserved"  # a deserves nothing: only an idle GPU could take it


def test_whole_gpus_are_unaffected() -> None:
    c = two_projects().running("fb", "b", "gpu-0", [0], gpu=0.5).submit("wa", "a", gpus=1)
    run = Run(c.snapshot()).settle()
    assert run.running() == {"fb", "wa"}
    assert device(run, "wa") == ("gpu-0", 1)


# -- capacity being released (the pipelined path) ----------------------------------------------------------------


def releasing_half(share: bool) -> Run:
    c = two_projects(gpus=1, share=share).running("fb", "b", "gpu-0", [0], gpu=0.5)
    c.workloads[-1] = dataclasses.replace(c.workloads[-1], state=State.RELEASING)
    c.submit("fa", "a", gpu=0.5)
    return Run(c.snapshot())


def test_a_fraction_waits_for_another_projects_releasing_share_to_be_gone() -> None:
    d = releasing_half(share=False).cycle()
    assert d.binds == ()
    p = d.pending_for("fa")
    assert p is not None
    assert p.code is PendingCode.WAITING_FOR_EVICTIONS
    assert [(x.node, x.devices[0].index) for x in p.nominated] == [("gpu-0", 0)]


def test_where_the_pool_allows_sharing_it_starts_beside_the_releasing_share() -> None:
    d = releasing_half(share=True).cycle()
    assert [b.workload for b in d.binds] == ["fa"]


# -- preemption, reclaim, consolidation --------------------------------------------------------------------------


def test_preemption_frees_room_on_the_projects_own_device_rather_than_join_another_projects() -> None:
    c = two_projects().project("b", deserved=1)
    c.running("b1", "b", "gpu-0", [0], gpu=0.5)  # room beside it, but it is b's
    c.running("low1", "a", "gpu-0", [1], gpu=0.5, priority="batch")
    c.running("low2", "a", "gpu-0", [1], gpu=0.5, priority="batch")
    c.submit("high", "a", gpu=0.5)
    run = Run(c.snapshot())
    d = run.cycle()
    assert [(e.workload, e.preemptor) for e in d.evictions] == [("low2", "high")]
    run.settle()
    assert run.running() == {"b1", "low1", "high"}
    assert device(run, "high") == ("gpu-0", 1)


def test_reclaim_empties_the_device_of_the_other_project_rather_than_leave_a_sharer() -> None:
    c = two_projects(gpus=1, owed=1).running("b1", "b", "gpu-0", [0], gpu=0.5)
    c.running("b2", "b", "gpu-0", [0], gpu=0.5).submit("fa", "a", gpu=0.5)
    run = Run(c.snapshot())
    d = run.cycle()
    assert sorted(e.workload for e in d.evictions) == ["b1", "b2"]
    run.settle()
    assert run.running() == {"fa"}
    assert (run.reason("b1"), run.reason("b2")) == ("no-shareable-device", "no-shareable-device")


def test_where_the_pool_allows_sharing_reclaim_takes_one_half() -> None:
    c = two_projects(gpus=1, owed=1, share=True)
    c.running("b1", "b", "gpu-0", [0], gpu=0.5).running("b2", "b", "gpu-0", [0], gpu=0.5)
    c.submit("fa", "a", gpu=0.5)
    d = Run(c.snapshot()).cycle()
    assert [e.workload for e in d.evictions] == ["b2"]


def test_consolidation_does_not_move_a_fraction_beside_another_projects() -> None:
    c = two_projects(gpus=1, nodes=2).running("a1", "a", "gpu-0", [0], gpu=0.5)
    c.running("b1", "b", "gpu-1", [0], gpu=0.5).submit("whole", "a", gpus=1)
    run = Run(c.snapshot(), WITH_CONSOLIDATE).settle()
    assert run.evicted() == []
    assert run.reason("whole") == "no-node-fits"


def test_where_the_pool_allows_sharing_consolidation_moves_it_there() -> None:
    c = two_projects(gpus=1, nodes=2, share=True).running("a1", "a", "gpu-0", [0], gpu=0.5)
    c.running("b1", "b", "gpu-1", [0], gpu=0.5).submit("whole", "a", gpus=1)
    run = Run(c.snapshot(), WITH_CONSOLIDATE).settle()
    # Either half frees the device and both lose as little; b1 started last, so b1 moves.
    assert run.evicted() == ["b1"]
    assert run.running() == {"a1", "b1", "whole"}
    assert device(run, "b1") == ("gpu-0", 0)


def test_a_reclaim_names_the_project_it_serves_not_its_workload() -> None:
    # The victim's readers are another tenant: they learn which project is owed, not what its work is called.
    c = two_projects(gpus=1, owed=1, share=True)
    c.running("b1", "b", "gpu-0", [0], gpu=0.5).running("b2", "b", "gpu-0", [0], gpu=0.5)
    c.submit("fa", "a", gpu=0.5)
    snapshot = c.snapshot()
    labelled = tuple(dataclasses.replace(w, label=f"'{w.id}-secret'") for w in snapshot.workloads)
    d = Run(dataclasses.replace(snapshot, workloads=labelled)).cycle()
    assert [e.message for e in d.evictions] == ["reclaimed for a workload of project a, which is below its fair share"]
