"""In-project preemption: strictly higher priority evicts lower, minimal victims, never across projects."""

from tests.core.builders import Cluster, Run


def test_training_preempts_batch_in_the_same_project() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=4).project("a", deserved=4)
    run = Run(c.snapshot())
    for i in range(4):  # started one after another
        run.submit(c, f"sweep{i}", "a", gpus=1, priority="batch").settle()
    run.submit(c, "train", "a", gpus=2, priority="training")
    d = run.cycle()
    assert sorted(e.workload for e in d.evictions) == ["sweep2", "sweep3"]  # the most recently started
    assert {e.reason.value for e in d.evictions} == {"preempt"}
    run.settle()
    assert "train" in run.running()


def test_equal_priority_never_preempts() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=2).project("a", deserved=2)
    c.submit("t1", "a", gpus=2, priority="training")
    run = Run(c.snapshot()).settle()
    run.submit(c, "t2", "a", gpus=1, priority="training")
    run.settle()
    assert run.evicted() == [] and "t2" in run.pending()


def test_high_priority_does_not_preempt_within_quota_work_of_another_project() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=4).project("a", deserved=2).project("b", deserved=2)
    c.submit("b0", "b", gpus=2, priority="batch").submit("serve", "a", gpus=2, priority="production")
    run = Run(c.snapshot()).settle()
    run.submit(c, "train", "a", gpus=1, priority="training")
    run.settle()
    assert run.running() == {"b0", "serve"}
    assert run.evicted() == []
    assert run.reason("train") == "over-deserved"


def test_victim_set_is_minimal_on_one_node() -> None:
    # Two 1-GPU sweeps and one 2-GPU sweep: a 2-GPU job needs just the big one, not the small two.
    c = Cluster().pool("h100", nodes=1, gpus=4).project("a", deserved=4)
    c.submit("s1", "a", gpus=1, priority="batch").submit("s2", "a", gpus=1, priority="batch")
    c.submit("s3", "a", gpus=2, priority="batch")
    run = Run(c.snapshot()).settle()
    run.submit(c, "t", "a", gpus=2, priority="training")
    d = run.cycle()
    assert [e.workload for e in d.evictions] == ["s3"]
    run.settle()
    assert run.running() == {"s1", "s2", "t"}


def test_lowest_priority_is_evicted_first() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=2).project("a", deserved=2)
    c.submit("nb", "a", gpus=1, priority="interactive").submit("sweep", "a", gpus=1, priority="batch")
    run = Run(c.snapshot()).settle()
    run.submit(c, "serve", "a", gpus=1, priority="production", preemptible=False)
    d = run.cycle()
    assert [e.workload for e in d.evictions] == ["sweep"]


def test_minimum_runtime_protects_fresh_training() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=1).project("a", deserved=1)
    c.submit("t", "a", gpus=1, priority="training", min_runtime=600)
    run = Run(c.snapshot()).settle()
    run.submit(c, "serve", "a", gpus=1, priority="production", preemptible=False)
    run.cycle()
    assert run.evicted() == []
    run.advance(601).settle()
    assert run.evicted() == ["t"] and "serve" in run.running()


def test_waiting_preemptor_keeps_the_capacity_it_evicted_for() -> None:
    # While victims release, a later lower-priority submit must not take the freed GPUs.
    c = Cluster().pool("h100", nodes=1, gpus=2).project("a", deserved=2)
    c.submit("s1", "a", gpus=1, priority="batch").submit("s2", "a", gpus=1, priority="batch")
    run = Run(c.snapshot()).settle()
    run.submit(c, "t", "a", gpus=2, priority="training")
    d = run.cycle()
    assert sorted(e.workload for e in d.evictions) == ["s1", "s2"]
    run.settle()
    assert run.running() == {"t"}
