"""Preemption where KAI-Scheduler and Kueue agree and gpupool used not to (issue 17, items 1-4): freeing quota as
well as capacity, victim gangs weighed whole, recency across nodes, and victim sets mixing a project's own
lower-priority work with other projects' borrowed work."""

import dataclasses

from gpupool.core import MILLI, DeviceShare, Placement, State
from tests.core.builders import Cluster, Run


def evictions(run: Run) -> list[tuple[str, str]]:
    return sorted((e.workload, e.reason.value) for e in run.cycle().evictions)


def gang_running(c: Cluster, wid: str, project: str, nodes: list[str], devices: range) -> Cluster:
    """A batch gang running one member on `devices` (whole GPUs) of each of `nodes`."""
    c.submit(wid, project, gpus=len(devices), workers=len(nodes), priority="batch")
    memory = c.nodes[0].devices[0].memory_mib
    shares = tuple(DeviceShare(i, MILLI, memory) for i in devices)
    placements = tuple(Placement(m, node, shares) for m, node in enumerate(nodes))
    c.workloads[-1] = dataclasses.replace(c.workloads[-1], state=State.RUNNING, placements=placements, start_time=c.now)
    return c


# -- 1. a project at its limit preempts its own lower-priority work -------------------------------------------------


def test_a_project_at_its_limit_evicts_its_own_batch_work_for_training() -> None:
    # Free GPUs are no use to it: its limit is the bar. Its newest batch work makes room under the limit.
    c = Cluster().pool("h100", nodes=1, gpus=8).project("a", deserved=2, limit=4)
    for i in range(4):
        c.running(f"sweep{i}", "a", "h100-0", [i], gpus=1, priority="batch")
    run = Run(c.snapshot())
    run.submit(c, "train", "a", gpus=2, priority="training")
    assert evictions(run) == [("sweep2", "preempt"), ("sweep3", "preempt")]
    run.settle()
    assert run.running() == {"sweep0", "sweep1", "train"}
    assert run.used_gpus("a") == 4


def test_a_production_service_at_its_projects_limit_evicts_interactive_work() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=8).project("a", deserved=4, limit=4)
    c.running("nb0", "a", "h100-0", [0], gpus=1, priority="interactive")
    c.running("nb1", "a", "h100-0", [1], gpus=1, priority="interactive")
    c.running("serve0", "a", "h100-0", [2, 3], gpus=2, priority="production", preemptible=False)
    run = Run(c.snapshot())
    run.submit(c, "serve1", "a", gpus=1, priority="production", preemptible=False)
    assert evictions(run) == [("nb1", "preempt")]
    run.settle()
    assert run.running() == {"nb0", "serve0", "serve1"}


def test_a_project_at_its_limit_never_evicts_equal_priority_work() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=8).project("a", deserved=2, limit=2)
    c.running("t0", "a", "h100-0", [0, 1], gpus=2, priority="training")
    run = Run(c.snapshot())
    run.submit(c, "t1", "a", gpus=1, priority="training")
    run.settle()
    assert run.evicted() == [] and run.reason("t1") == "over-limit"


# -- 2. a victim gang is weighed as a unit --------------------------------------------------------------------------


def test_a_gang_reclaims_one_victim_gang_rather_than_a_single_on_each_node() -> None:
    # On each node the cheapest way to seat one member is b's 1-GPU job there; member by member that makes two
    # victims, where b's gang alone (one victim) frees both nodes.
    c = Cluster().pool("h100", nodes=2, gpus=8).project("a", deserved=8).project("b", deserved=2)
    gang_running(c, "g", "b", ["h100-0", "h100-1"], range(4))
    c.running("s0", "b", "h100-0", [4], gpus=1, priority="batch")
    c.running("s1", "b", "h100-1", [4], gpus=1, priority="batch")
    run = Run(c.snapshot())
    run.submit(c, "dist", "a", gpus=4, workers=2)
    assert evictions(run) == [("g", "reclaim")]
    run.settle()
    assert run.running() == {"dist", "s0", "s1"}


def test_a_gang_reclaims_a_victim_gang_beyond_the_nodes_of_cheaper_singles() -> None:
    # Eight nodes each offer one member a cheap 1-GPU victim; b's gang on the last two nodes is the one victim.
    c = Cluster().pool("h100", nodes=10, gpus=8).project("a", deserved=8).project("b", deserved=1)
    c.project("c", deserved=64)
    gang_running(c, "g", "b", ["h100-8", "h100-9"], range(4))
    for i in range(8):
        c.running(f"s{i}", "b", f"h100-{i}", [0], gpus=1, priority="batch")
        c.running(f"c{i}", "c", f"h100-{i}", range(1, 5), gpus=4, priority="production", preemptible=False)
    for i in (8, 9):
        c.running(f"c{i}", "c", f"h100-{i}", range(4, 8), gpus=4, priority="production", preemptible=False)
    run = Run(c.snapshot())
    run.submit(c, "dist", "a", gpus=4, workers=2)
    assert evictions(run) == [("g", "reclaim")]


# -- 3. recency across nodes ----------------------------------------------------------------------------------------


def one_job_per_node(nodes: int, project: str = "a", newest_first: bool = False) -> Cluster:
    """A 1-GPU batch job of `project` on each 1-GPU node, started in node order (or the reverse)."""
    c = Cluster().pool("h100", nodes=nodes, gpus=1)
    for i in reversed(range(nodes)) if newest_first else range(nodes):
        c.running(f"j{i}", project, f"h100-{i}", [0], gpus=1, priority="batch")
    return c


def test_preemption_takes_the_newest_job_whichever_node_it_runs_on() -> None:
    c = one_job_per_node(9).project("a", deserved=9)
    run = Run(c.snapshot())
    run.submit(c, "t", "a", gpus=1, priority="training")
    assert evictions(run) == [("j8", "preempt")]


def test_reclaim_takes_the_newest_borrowed_job_whichever_node_it_runs_on() -> None:
    c = one_job_per_node(9, project="b").project("a", deserved=1).project("b", deserved=0)
    run = Run(c.snapshot())
    run.submit(c, "t", "a", gpus=1)
    assert evictions(run) == [("j8", "reclaim")]


def test_the_newest_job_on_the_first_node_is_still_the_one_taken() -> None:
    c = one_job_per_node(12, newest_first=True).project("a", deserved=12)
    run = Run(c.snapshot())
    run.submit(c, "t", "a", gpus=1, priority="training")
    assert evictions(run) == [("j0", "preempt")]


# -- 4. victim sets mixing own lower-priority work and others' borrowed work ----------------------------------------


def own_and_borrowed(b_deserved: int) -> Run:
    """A 4-GPU node: a's 1-GPU batch job and three 1-GPU jobs of b; a (deserved 2) submits a 2-GPU training run."""
    c = Cluster().pool("h100", nodes=1, gpus=4).project("a", deserved=2).project("b", deserved=b_deserved)
    c.running("a-batch", "a", "h100-0", [0], gpus=1, priority="batch")
    for i in range(3):
        c.running(f"b{i}", "b", "h100-0", [i + 1], gpus=1)
    run = Run(c.snapshot())
    run.submit(c, "train", "a", gpus=2, priority="training")
    return run


def test_own_batch_work_and_a_borrowed_job_together_make_room() -> None:
    # a's batch job frees one GPU and b's borrowed job another; neither alone seats a's 2-GPU training run,
    # and a ends at its fair share (2), b at its deserved quota (2).
    run = own_and_borrowed(b_deserved=2)
    assert evictions(run) == [("a-batch", "preempt"), ("b2", "reclaim")]
    run.settle()
    assert run.running() == {"b0", "b1", "train"}


def test_a_mix_never_takes_a_borrower_below_its_deserved_quota() -> None:
    # b uses just its deserved quota: only a's own work may go, and it is not enough.
    run = own_and_borrowed(b_deserved=3)
    run.settle()
    assert run.evicted() == [] and "train" in run.pending()


# -- blockers a preemption names --------------------------------------------------------------------------------------


def test_a_service_behind_a_training_runs_minimum_runtime_says_until_when() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=1).project("a", deserved=1)
    c.running("t", "a", "h100-0", [0], gpus=1, priority="training", min_runtime=600)
    run = Run(c.snapshot())
    run.submit(c, "serve", "a", gpus=1, priority="production", preemptible=False)
    reason = run.cycle().pending_for("serve")
    assert reason is not None and reason.code.value == "min-runtime"
    until = int((run.workload("t").start_time or 0) + 600)
    assert (reason.arg("victim"), reason.arg("project"), reason.arg("until")) == ("t", "a", until)
