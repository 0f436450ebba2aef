"""Quotas and borrowing: deserved is guaranteed, limit is hard, only preemptible work runs over quota."""

from tests.core.builders import Cluster, Run


def test_preemptible_work_borrows_idle_gpus_beyond_deserved() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=8).project("a", deserved=2).project("b", deserved=6)
    for i in range(6):
        c.submit(f"a{i}", "a", gpus=1)
    run = Run(c.snapshot()).settle()
    assert run.used_gpus("a") == 6


def test_limit_is_a_hard_cap_even_on_an_idle_cluster() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=8).project("a", deserved=2, limit=3)
    for i in range(5):
        c.submit(f"a{i}", "a", gpus=1)
    run = Run(c.snapshot()).settle()
    assert run.used_gpus("a") == 3
    assert run.reason("a3") == "over-limit"
    assert "limit of 3 GPUs" in run.decisions[-1].pending_for("a3").message  # type: ignore[union-attr]


def test_department_limit_caps_its_projects_together() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=8).department("d", deserved=4, limit=4)
    c.project("a", department="d", deserved=2).project("b", department="d", deserved=2)
    for i in range(4):
        c.submit(f"a{i}", "a", gpus=1).submit(f"b{i}", "b", gpus=1)
    run = Run(c.snapshot()).settle()
    assert run.used_gpus("a") + run.used_gpus("b") == 4


def test_non_preemptible_workload_over_deserved_stays_pending() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=8).project("a", deserved=2)
    c.submit("serve1", "a", gpus=2, priority="production").submit("serve2", "a", gpus=1, priority="production")
    run = Run(c.snapshot()).settle()
    assert run.running() == {"serve1"}
    assert run.reason("serve2") == "nonpreemptible-over-deserved"


def test_non_preemptible_must_fit_the_department_deserved_too() -> None:
    # Projects promise more than their department holds: the department's deserved still binds.
    c = Cluster().pool("h100", nodes=1, gpus=8).department("d", deserved=2)
    c.project("a", department="d", deserved=2).project("b", department="d", deserved=2)
    c.submit("a1", "a", gpus=2, priority="production").submit("b1", "b", gpus=1, priority="production")
    run = Run(c.snapshot()).settle()
    assert run.running() == {"a1"}
    assert run.reason("b1") == "nonpreemptible-over-deserved"


def test_surplus_is_split_by_over_quota_weight() -> None:
    c = Cluster().pool("h100", nodes=2, gpus=8)
    c.project("a", deserved=2, weight=3).project("b", deserved=2, weight=1)
    for i in range(16):
        c.submit(f"a{i}", "a", gpus=1).submit(f"b{i}", "b", gpus=1)
    decision = Run(c.snapshot()).cycle()
    shares = {s.queue: s.fair_share for s in decision.shares}
    # 12 surplus GPUs split 3:1 on top of 2 deserved each.
    assert shares == {"a": 11000, "b": 5000}


def test_cpu_limit_caps_a_project_where_set() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=8).project("a", deserved=8, cpu_limit=20_000)
    for i in range(4):
        c.submit(f"a{i}", "a", gpus=1, cpus=8)
    run = Run(c.snapshot()).settle()
    assert len(run.running()) == 2
    p = run.decisions[-1].pending_for("a2")
    assert p is not None and p.code.value == "over-limit" and "CPU limit of 20000 millicores" in p.message


def test_non_preemptible_work_must_fit_the_memory_deserved_where_set() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=8).project("a", deserved=8, memory_deserved=64 * 1024)
    c.submit("s1", "a", gpus=1, memory_gib=48, priority="production")
    c.submit("s2", "a", gpus=1, memory_gib=48, priority="production")
    c.submit("t", "a", gpus=1, memory_gib=48, priority="training")  # preemptible: may go over
    run = Run(c.snapshot()).settle()
    assert run.running() == {"s1", "t"}
    assert run.reason("s2") == "nonpreemptible-over-deserved"


def test_a_gpu_count_is_singular_for_one_gpu_or_a_part_of_one() -> None:
    from gpupool.core.quota import gpu_count

    assert [gpu_count(m) for m in (0, 250, 1000, 1500, 2000)] == ["0 GPUs", "0.25 GPU", "1 GPU", "1.5 GPUs", "2 GPUs"]


def test_a_limit_of_one_gpu_is_worded_in_the_singular() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=8).project("a", deserved=1, limit=1)
    for i in range(2):
        c.submit(f"a{i}", "a", gpus=1)
    run = Run(c.snapshot()).settle()
    p = run.decisions[-1].pending_for("a1")
    assert p is not None and p.message == "a would exceed its limit of 1 GPU in pool h100 (using 1, asks 1)"
