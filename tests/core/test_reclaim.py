"""Reclaim: projects below their share take GPUs back from borrowers, never below the victim's deserved."""

import dataclasses

from gpupool.core import State, schedule
from tests.core.builders import Cluster, Run


def borrowing_cluster() -> tuple[Cluster, Run]:
    """Project b has borrowed the whole node while a, owed 4 GPUs, was idle."""
    c = Cluster().pool("h100", nodes=1, gpus=8).project("a", deserved=4).project("b", deserved=4)
    run = Run(c.snapshot())
    for i in range(8):  # started one after another
        run.submit(c, f"b{i}", "b", gpus=1).settle()
    return c, run


def two_departments(c: Cluster) -> Cluster:
    """d1 (projects a and b, 2 GPUs deserved each) and d2 (project c, 4 GPUs deserved)."""
    c.department("d1", deserved=4).department("d2", deserved=4)
    return (
        c.project("a", department="d1", deserved=2)
        .project("b", department="d1", deserved=2)
        .project("c", department="d2", deserved=4)
    )


def test_project_within_deserved_reclaims_from_a_borrower() -> None:
    c, run = borrowing_cluster()
    assert run.used_gpus("b") == 8
    run.submit(c, "a0", "a", gpus=2)
    first = run.cycle()
    assert sorted(e.workload for e in first.evictions) == ["b6", "b7"]  # the newest go first
    assert all(e.reason.value == "reclaim" and e.preemptor == "a0" for e in first.evictions)
    assert first.pending_for("a0").code.value == "waiting-for-evictions"  # type: ignore[union-attr]
    run.settle()
    assert "a0" in run.running() and run.used_gpus("b") == 6


def test_reclaim_never_pushes_the_victim_below_its_deserved() -> None:
    c, run = borrowing_cluster()
    run.submit(c, "big", "a", gpus=8)  # a asks for more than its share: it can have 4 back, not 8
    run.settle()
    assert "big" not in run.running()
    assert run.used_gpus("b") == 8
    assert run.evicted() == []


def test_each_victim_is_evicted_exactly_once() -> None:
    c, run = borrowing_cluster()
    for i in range(4):
        run.submit(c, f"a{i}", "a", gpus=1)
    run.settle()
    assert sorted(run.evicted()) == ["b4", "b5", "b6", "b7"]
    assert len(run.evicted()) == len(set(run.evicted()))


def test_reclaim_ignores_priority_across_projects() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=4).project("a", deserved=2).project("b", deserved=2)
    for i in range(4):
        c.submit(f"b{i}", "b", gpus=1, priority="interactive", preemptible=True)
    run = Run(c.snapshot()).settle()
    run.submit(c, "sweep", "a", gpus=1, priority="batch")
    run.settle()
    assert "sweep" in run.running()


def test_non_preemptible_borrower_is_never_a_victim() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=4).project("a", deserved=2).project("b", deserved=4)
    c.submit("serve", "b", gpus=4, priority="production")
    run = Run(c.snapshot()).settle()
    run.submit(c, "a0", "a", gpus=1)
    run.settle()
    assert run.evicted() == [] and "a0" in run.pending()


def test_no_node_could_host_it_even_after_evictions_so_nothing_is_evicted() -> None:
    c = Cluster().pool("h100", nodes=2, gpus=4).project("a", deserved=4).project("b", deserved=4)
    for i in range(8):
        c.submit(f"b{i}", "b", gpus=1)
    run = Run(c.snapshot()).settle()
    run.submit(c, "wide", "a", gpus=6)  # no node has 6 GPUs
    run.settle()
    assert run.evicted() == []
    assert run.reason("wide") == "never-fits"


def test_fair_share_reclaim_respects_minimum_runtime_but_a_deserved_quota_does_not_wait() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=4).project("a", deserved=1).project("b", deserved=1)
    for i in range(4):
        c.submit(f"b{i}", "b", gpus=1, min_runtime=600)
    run = Run(c.snapshot()).settle()
    run.submit(c, "a0", "a", gpus=1).submit(c, "a1", "a", gpus=1)
    run.settle()
    assert "a0" in run.running()  # a's deserved GPU comes back at once
    assert "a1" in run.pending() and len(run.evicted()) == 1  # its fair share beyond that waits
    run.advance(600)
    run.settle()
    assert "a1" in run.running() and len(run.evicted()) == 2


def test_an_owed_project_takes_a_young_workload_only_when_no_older_one_will_do() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=8).project("a", deserved=4).project("b", deserved=4)
    run = Run(c.snapshot())
    for i in range(5):
        run.submit(c, f"b{i}", "b", gpus=1, min_runtime=600).settle()
    run.advance(600)
    run.submit(c, "b-young", "b", gpus=1, min_runtime=600).settle()
    run.submit(c, "a0", "a", gpus=3).settle()  # 2 GPUs are free; b holds 2 above its quota
    assert run.evicted() == ["b4"]  # the newest of those past their minimum runtime, not b-young
    run.submit(c, "a1", "a", gpus=1).settle()
    assert run.evicted() == ["b4", "b3"]  # still an older one


def test_an_owed_project_takes_back_from_a_young_sibling_in_a_department_over_its_quota() -> None:
    c = two_departments(Cluster().pool("h100", nodes=1, gpus=8))
    run = Run(c.snapshot())
    run.submit(c, "c0", "c", gpus=2).settle()
    for i in range(6):
        run.submit(c, f"b{i}", "b", gpus=1, min_runtime=600).settle()  # d1 holds 6 of its 4; all 8 are taken
    run.submit(c, "a0", "a", gpus=2).settle()
    assert "a0" in run.running()
    assert sorted(run.evicted()) == ["b4", "b5"]  # inside d1, so d1 being over its quota is no bar


def test_a_victim_set_the_final_check_refuses_gives_way_to_the_next_cheapest() -> None:
    # Evicting b's half-GPU notebook on node 0 is cheapest and makes room with the free half beside it, but
    # d1 would then grow past its fair share; a training run of b's on node 1 does not grow d1.
    c = Cluster().pool("h100", nodes=2, gpus=2)
    c.department("d1", deserved=2).department("d2", deserved=2)
    c.project("a", department="d1", deserved=1).project("b", department="d1", deserved=1)
    c.project("c", department="d2", deserved=2)
    c.running("c0", "c", "h100-0", [1], gpus=1)
    c.running("b1", "b", "h100-1", [0], gpus=1).running("b2", "b", "h100-1", [1], gpus=1)
    run = Run(c.snapshot())
    run.submit(c, "nb", "b", gpu=0.5, priority="interactive").settle()
    run.submit(c, "c1", "c", gpus=2)  # d2 wants more too, so d1's fair share is its deserved 2
    run.submit(c, "a0", "a", gpus=1).settle()
    assert "a0" in run.running()
    assert run.evicted() == ["b2"]


def test_department_over_its_fair_share_gives_back_to_the_other_department() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=8)
    c.department("d1", deserved=4).department("d2", deserved=4)
    c.project("p1", department="d1", deserved=4).project("p2", department="d2", deserved=4)
    for i in range(8):
        c.submit(f"p1-{i}", "p1", gpus=1)
    run = Run(c.snapshot()).settle()
    for i in range(4):
        run.submit(c, f"p2-{i}", "p2", gpus=1)
    run.settle()
    assert run.used_gpus("p1") == 4 and run.used_gpus("p2") == 4


def test_nothing_is_evicted_when_no_node_fits_even_after_evicting_every_candidate() -> None:
    # Each node keeps 2 GPUs of non-preemptible work: freeing the rest leaves 2 per node, and a wants 3.
    c = Cluster().pool("h100", nodes=2, gpus=4).project("a", deserved=4).project("b", deserved=4)
    for n in (0, 1):
        c.running(f"serve{n}", "b", f"h100-{n}", [0, 1], gpus=2, priority="production")
        c.running(f"sweep{n}", "b", f"h100-{n}", [2, 3], gpus=2, priority="batch")
    c.submit("a3", "a", gpus=3)
    run = Run(c.snapshot()).settle()
    assert run.evicted() == [] and "a3" in run.pending()
    assert run.reason("a3") == "no-node-fits"


def test_reclaim_from_a_sibling_inside_a_full_department() -> None:
    # d1 is at its share, so a may not grow it at d2's expense, but b borrowed a's share inside d1.
    c = two_departments(Cluster().pool("h100", nodes=2, gpus=4))
    run = Run(c.snapshot())
    for i in range(4):
        run.submit(c, f"b{i}", "b", gpus=1).settle()
        run.submit(c, f"c{i}", "c", gpus=1).settle()
    run.submit(c, "a0", "a", gpus=1).settle()
    assert "a0" in run.running()
    assert run.evicted() == ["b3"]
    assert run.used_gpus("c") == 4 and run.used_gpus("b") == 3


def test_an_owed_project_takes_back_a_straddling_gang() -> None:
    # b's only work above its quota is part of one 6-GPU run: 4 GPUs of it within b's deserved, 2 above.
    c = Cluster().pool("h100", nodes=1, gpus=8).project("a", deserved=4).project("b", deserved=4)
    run = Run(c.snapshot())
    run.submit(c, "b-big", "b", gpus=6).settle()
    run.submit(c, "a0", "a", gpus=4).settle()
    assert run.evicted() == ["b-big"]
    assert "a0" in run.running()
    run.submit(c, "b-small", "b", gpus=4).settle()
    assert "b-small" in run.running()  # b has its guarantee again at once
    assert "b-big" in run.pending() and run.evicted() == ["b-big"]  # and takes nothing back from a


def test_a_straddling_workload_is_taken_only_when_nothing_smaller_will_do() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=8).project("a", deserved=4).project("b", deserved=4)
    run = Run(c.snapshot())
    run.submit(c, "b-big", "b", gpus=5).settle()
    run.submit(c, "b-one", "b", gpus=1).settle()
    run.submit(c, "a0", "a", gpus=3).settle()  # 2 GPUs are free; the third comes from b
    assert run.evicted() == ["b-one"]  # b keeps 5 of its deserved 4: no straddling victim was needed
    assert "a0" in run.running()


def test_a_project_above_its_deserved_quota_never_takes_a_straddling_workload() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=8).project("a", deserved=2).project("b", deserved=6)
    run = Run(c.snapshot())
    run.submit(c, "b-big", "b", gpus=8).settle()
    run.submit(c, "a-wide", "a", gpus=3).settle()  # more than a is owed: fair-share reclaim only
    assert run.evicted() == [] and "a-wide" in run.pending()


def test_an_owed_project_takes_a_young_sibling_workload_and_an_older_one_from_another_department_together() -> None:
    # a is owed 4 GPUs on one node. Node 0 has 2 free, a young workload of its sibling b (which borrowed
    # inside d1) and an old one of c, far above its fair share; c's other work is not preemptible.
    c = Cluster().pool("h100", nodes=3, gpus=4)
    c.department("d1", deserved=4).department("d2", deserved=4)
    c.project("a", department="d1", deserved=4).project("b", department="d1", deserved=0)
    c.project("c", department="d2", deserved=4)
    c.running("b-young", "b", "h100-0", [0], gpus=1, min_runtime=600)
    c.running("c-old", "c", "h100-0", [1], gpus=1)
    for n in (1, 2):
        c.running(f"serve{n}", "c", f"h100-{n}", [0, 1, 2, 3], gpus=4, priority="production")
    run = Run(c.snapshot())
    run.submit(c, "a0", "a", gpus=4).settle()
    assert "a0" in run.running()  # neither rule alone frees the node: the young one is owed, the old one fair
    assert sorted(run.evicted()) == ["b-young", "c-old"]


def test_what_a_sibling_borrows_does_not_void_a_projects_guarantee() -> None:
    # d1 uses 3 of its 4 because b borrows 1 beyond its own 2, so a (owed 2) would take d1 to 5. b's extra
    # GPU and a young workload of c (above its deserved in the other department) free node 1 for a.
    c = two_departments(Cluster().pool("h100", nodes=2, gpus=4))
    for i in range(3):
        c.running(f"b{i}", "b", "h100-1", [i], gpus=1)
    c.running("c-young", "c", "h100-1", [3], gpus=1, min_runtime=600)
    for i in range(4):
        c.running(f"c{i}", "c", "h100-0", [i], gpus=1, min_runtime=600)
    run = Run(c.snapshot())
    run.submit(c, "a0", "a", gpus=2).settle()
    assert "a0" in run.running()
    assert sorted(run.evicted()) == ["b2", "c-young"]
    assert run.used_gpus("b") == 2 and run.used_gpus("c") == 4


def test_a_second_reclaimer_is_nominated_on_what_the_first_ones_victim_releases_beyond_its_need() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=2).project("a", deserved=1).project("b", deserved=1)
    c.submit("b0", "b", gpus=1).submit("b1", "b", gpus=1)
    run = Run(c.snapshot()).settle()
    run.submit(c, "a0", "a", gpu=0.5).submit(c, "a1", "a", gpu=0.5)
    first = run.cycle()
    assert len(first.evictions) == 1  # one whole GPU makes room for both halves
    for wid in ("a0", "a1"):
        assert run.reason(wid) == "waiting-for-evictions"
    run.settle()
    assert {"a0", "a1"} <= run.running() and len(run.evicted()) == 1


def blocked_nodes(a: int, c: int) -> Cluster:
    """Two 4-GPU nodes; on each, c's GPUs sit beside one GPU of b (deserved 2, so within its quota)."""
    cl = Cluster().pool("h100", nodes=2, gpus=4)
    cl.project("a", deserved=a).project("b", deserved=2).project("c", deserved=c)
    cl.running("b0", "b", "h100-0", [0], gpus=1)
    for i in range(3):
        cl.running(f"c{i}", "c", "h100-0", [i + 1], gpus=1)
    cl.running("b1", "b", "h100-1", [0], gpus=1)
    return cl.running("c3", "c", "h100-1", [1], gpus=1).running("c4", "c", "h100-1", [2], gpus=1)


def test_an_owed_project_moves_work_that_may_not_be_reclaimed_to_empty_a_node() -> None:
    # a is owed a whole node, c borrows 3 GPUs, but b's GPU on each node may not be reclaimed: no victim
    # set empties a node, so one of b's workloads moves.
    c = blocked_nodes(a=4, c=2)
    run = Run(c.snapshot())
    run.submit(c, "a0", "a", gpus=4)
    first = run.cycle()
    moved = [e.workload for e in first.evictions if e.reason.value == "consolidate"]
    assert len(moved) == 1 and moved[0] in ("b0", "b1")
    assert all(e.workload.startswith("c") for e in first.evictions if e.reason.value == "reclaim")
    assert run.reason(moved[0]) == "waiting-for-evictions"  # nominated for its new GPU at once
    run.settle()
    assert "a0" in run.running() and moved[0] in run.running()
    assert run.used_gpus("b") == 2 and run.used_gpus("c") == 2


def test_nothing_moves_for_a_project_above_its_deserved_quota() -> None:
    c = blocked_nodes(a=2, c=4)
    run = Run(c.snapshot())
    run.submit(c, "a0", "a", gpus=4).settle()  # twice a's deserved quota: no guarantee to honour
    assert run.evicted() == [] and "a0" in run.pending()


def test_a_moved_workload_is_requeued_with_its_nomination() -> None:
    c = blocked_nodes(a=4, c=2)
    run = Run(c.snapshot())
    run.submit(c, "a0", "a", gpus=4)
    first = run.cycle()
    (moved,) = [e.workload for e in first.evictions if e.reason.value == "consolidate"]
    (target,) = {p.node for p in first.pending_for(moved).nominated}  # type: ignore[union-attr]
    assert run.workload(moved).nominated_nodes == (target,)


def test_a_moved_workloads_new_room_stays_held_while_it_stops() -> None:
    # In the control plane an evicted workload stays releasing through its grace period; nothing else may take
    # the GPU its move was nominated to meanwhile, or its project would fall below its quota.
    c = blocked_nodes(a=4, c=2).pool("h100", nodes=1, gpus=4).project("x", deserved=3)
    for i in range(3):
        c.running(f"x{i}", "x", "h100-2", [i], gpus=1)
    c.submit("a0", "a", gpus=4)
    before = c.snapshot()
    first = schedule(before)
    (moved,) = [e.workload for e in first.evictions if e.reason.value == "consolidate"]
    spot = {p.node for p in first.pending_for(moved).nominated}  # type: ignore[union-attr]
    stopping = {e.workload for e in first.evictions}
    c.workloads = [
        dataclasses.replace(w, state=State.RELEASING, nominated_nodes=tuple(spot) if w.id == moved else ())
        if w.id in stopping else w
        for w in before.workloads
    ]  # fmt: skip
    c.submit("x-new", "x", gpus=1)  # fits only where the moved workload is to restart
    second = schedule(c.snapshot())
    assert "x-new" not in {b.workload for b in second.binds}
    assert not any(p.node in spot for b in second.binds for p in b.placements)
