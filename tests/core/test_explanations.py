"""Every pending workload carries a reason code and a sentence a user can act on."""

from gpupool.core import PendingCode, schedule
from tests.core.builders import Cluster, Run


def reasons(run: Run) -> dict[str, PendingCode]:
    return {p.workload: p.code for p in run.decisions[-1].pending}


def test_every_pending_workload_has_a_reason() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=4).project("a", deserved=2, limit=3).project("b", deserved=2)
    c.project("c", deserved=0)
    c.submit("a1", "a", gpus=3).submit("a2", "a", gpus=1)  # a2: over a's limit
    c.submit("serve", "b", gpus=3, priority="production")  # over b's deserved, not preemptible
    c.submit("huge", "b", gpus=16)  # no node has 16 GPUs
    c.submit("ddp", "c", gpus=1, workers=2)  # room for one member only
    run = Run(c.snapshot()).settle()
    got = reasons(run)
    assert got == {
        "a2": PendingCode.OVER_LIMIT,
        "serve": PendingCode.NONPREEMPTIBLE_OVER_DESERVED,
        "huge": PendingCode.NEVER_FITS,
        "ddp": PendingCode.GANG_UNPLACEABLE,
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
