"""Every pending workload carries a reason code and a sentence a user can act on."""

from gpupool.core import Pending, PendingCode, schedule
from tests.core.builders import Cluster, Run
from tests.core.test_settling import _snapshot


def reasons(run: Run) -> dict[str, PendingCode]:
    return {p.workload: p.code for p in run.decisions[-1].pending}


def test_every_pending_workload_has_a_reason() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=4).project("a", deserved=2, limit=3).project("b", deserved=2)
    c.project("c", deserved=0)
    c.submit("a1", "a", gpus=3).submit("a2", "a", gpus=1)  # a2: over a's limit
    c.submit("serve", "b", gpus=3, priority="production")  # over b's deserved, not preemptible
    c.submit("huge", "b", gpus=16)  # no node has 16 GPUs
    c.submit("ddp", "c", gpus=1, workers=2)  # room for one member only, and c deserves none of it
    run = Run(c.snapshot()).settle()
    got = reasons(run)
    assert got == {
        "a2": PendingCode.OVER_LIMIT,
        "serve": PendingCode.NONPREEMPTIBLE_OVER_DESERVED,
        "huge": PendingCode.NEVER_FITS,
        "ddp": PendingCode.OVER_DESERVED,
    }
    assert all(p.message for p in run.decisions[-1].pending)


def test_waiting_for_evictions_names_the_node() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=1).project("a", deserved=1)
    c.submit("sweep", "a", gpus=1, priority="batch")
    run = Run(c.snapshot()).settle()
    run.submit(c, "train", "a", gpus=1, priority="training")
    d = run.cycle()
    p = d.pending_for("train")
    assert p is not None and p.code is PendingCode.WAITING_FOR_EVICTIONS
    assert "h100-0" in p.message and p.nominated[0].node == "h100-0"


def test_queued_behind_higher_priority_workloads() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=1).project("a", deserved=1)
    c.submit("serve", "a", gpus=1, priority="production")
    c.submit("t1", "a", gpus=1, priority="training").submit("nb", "a", gpus=1, priority="interactive")
    run = Run(c.snapshot()).settle()
    p = run.decisions[-1].pending_for("nb")
    assert p is not None and p.code is PendingCode.QUEUED_BEHIND
    assert "behind 1 higher-priority workload" in p.message


def test_strict_fifo_blocks_behind_its_head() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=2).project("a", deserved=2, strict_fifo=True)
    c.submit("w0", "a", gpus=1)
    run = Run(c.snapshot()).settle()
    run.submit(c, "head", "a", gpus=2).submit(c, "small", "a", gpus=1)
    run.settle()
    assert "small" in run.pending()
    p = run.decisions[-1].pending_for("small")
    assert p is not None and p.code is PendingCode.QUEUED_BEHIND and "head" in p.message


def test_best_effort_fifo_lets_smaller_work_pass_a_blocked_head() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=2).project("a", deserved=2)
    c.submit("w0", "a", gpus=1)
    run = Run(c.snapshot()).settle()
    run.submit(c, "head", "a", gpus=2).submit(c, "small", "a", gpus=1)
    run.settle()
    assert "small" in run.running() and "head" in run.pending()


def test_unknown_project_is_explained_not_crashed() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=1).project("a", deserved=1)
    c.submit("w", "ghost", gpus=1)
    d = schedule(c.snapshot())
    p = d.pending_for("w")
    assert p is not None and "does not exist" in p.message


def pending(run: Run, wid: str) -> Pending:
    p = run.decisions[-1].pending_for(wid)
    assert p is not None
    return p


def test_over_the_project_limit_names_the_quota_and_its_numbers() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=8).project("a", deserved=2, limit=3).project("b")
    c.submit("a1", "a", gpus=3).submit("a2", "a", gpus=1)
    p = pending(Run(c.snapshot()).settle(), "a2")
    assert (p.code, p.args) == (
        PendingCode.OVER_LIMIT,
        (("queue", "a"), ("level", "project"), ("pool", "h100"), ("resource", "gpu"), ("used", 3000),
         ("quota", 3000), ("asks", 1000)),
    )  # fmt: skip


def test_over_the_department_limit_names_the_department() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=8).department("research", deserved=2, limit=2)
    c.project("a", department="research", deserved=1).project("b", department="research", deserved=1)
    c.submit("b1", "b", gpus=2).submit("a1", "a", gpus=1)
    p = pending(Run(c.snapshot()).settle(), "a1")
    assert p.code is PendingCode.OVER_LIMIT
    assert dict(p.args) == {
        "queue": "research", "level": "department", "pool": "h100", "resource": "gpu", "asks": 1000,
        "used": 2000, "quota": 2000,
    }  # fmt: skip


def test_a_job_beyond_its_deserved_quota_says_so_not_that_no_node_fits() -> None:
    """The issue's case: the cluster is full, and the project already has its deserved share, so only an idle GPU
    could take the job; the reason names the quota, the usage and the ask, not a lack of nodes."""
    c = Cluster().pool("h100", nodes=1, gpus=2).project("a", deserved=1).project("b", deserved=1)
    c.running("a0", "a", "h100-0", [0]).running("b0", "b", "h100-0", [1], gpus=1)
    c.submit("a1", "a", gpus=1)
    p = pending(Run(c.snapshot()).settle(), "a1")
    assert p.code is PendingCode.OVER_DESERVED
    assert dict(p.args) == {
        "queue": "a", "level": "project", "pool": "h100", "resource": "gpu", "asks": 1000, "used": 1000,
        "quota": 1000, "fair": 1000,
    }  # fmt: skip
    assert p.message == (
        "project a uses 1 of its deserved 1 GPU in pool h100; asking 1 more, it may only borrow idle GPUs, "
        "and none are idle"
    )


def test_a_gang_names_the_closest_node_and_what_it_lacks() -> None:
    c = Cluster().pool("h100", nodes=2, gpus=4).project("a", deserved=8).project("b")
    c.running("b0", "b", "h100-0", [0, 1, 2], gpus=3, priority="production").running(
        "b1", "b", "h100-1", [0, 1], gpus=2, priority="production"
    )
    c.submit("ddp", "a", gpus=3, workers=2)
    p = pending(Run(c.snapshot()).settle(), "ddp")
    assert (p.code, p.args) == (
        PendingCode.GANG_UNPLACEABLE,
        (("members", 2), ("gpus", 3), ("node", "h100-1"), ("lacks_gpus", 1), ("fits", 0)),
    )


def test_waiting_for_reclaim_names_the_borrowers_and_the_gpus() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=2).project("a", deserved=2).project("b")
    c.running("b0", "b", "h100-0", [0, 1], gpus=2, priority="batch")
    c.submit("a1", "a", gpus=2)
    d = Run(c.snapshot()).cycle()
    p = d.pending_for("a1")
    assert p is not None and p.code is PendingCode.WAITING_FOR_EVICTIONS
    assert p.args == (("victims", 1), ("gpu_milli", 2000), ("borrowers", "b"), ("nodes", "h100-0"))


def test_queued_behind_carries_the_blocker_and_its_numbers() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=1).project("a", deserved=1)
    c.submit("serve", "a", gpus=1, priority="production")
    c.submit("t1", "a", gpus=1, priority="training").submit("nb", "a", gpus=1, priority="interactive")
    p = pending(Run(c.snapshot()).settle(), "nb")
    # Project a alone fills the pool: the blocker is the pool (its closest node lacks a GPU), not a quota.
    assert p.args[:3] == (("ahead", 1), ("project", "a"), ("blocker", "no-node-fits"))
    assert dict(p.args)["node"] == "h100-0" and dict(p.args)["lacks_gpus"] == 1


def test_a_project_alone_in_a_full_pool_waits_for_room_not_for_its_quota() -> None:
    # Its fair share is the whole pool, so asking for more than the pool passes its fair share; but no other
    # project holds a GPU it could get back: what it lacks is room.
    c = Cluster().pool("h100", nodes=2, gpus=4).project("a", deserved=8)
    c.submit("busy", "a", gpus=3).submit("ddp", "a", gpus=2, workers=3)
    assert pending(Run(c.snapshot()).settle(), "ddp").code is PendingCode.GANG_UNPLACEABLE


def test_borrowed_gpus_held_by_another_project_make_it_over_deserved() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=2).project("a", deserved=0).project("b", deserved=2)
    c.running("bw", "b", "h100-0", [0, 1], gpus=2).submit("aw", "a", gpus=1)
    p = pending(Run(c.snapshot()).settle(), "aw")
    assert p.code is PendingCode.OVER_DESERVED
    assert dict(p.args)["asks"] == 1000


def test_a_reasons_argument_names_are_unique_and_shared_reasons_stay_each_workloads_own() -> None:
    # The store keeps the arguments as a mapping by name (beside the sentence), and allocate hands one reason to
    # every workload of a class it does not try again: each pending entry must still name its own workload.
    for seed in range(4):
        d = schedule(_snapshot(seed))
        assert d.pending
        assert len({p.workload for p in d.pending}) == len(d.pending)
        for p in d.pending:
            names = [name for name, _ in p.args]
            assert len(names) == len(set(names)), (p.code, p.args)
