"""Property tests of preemption's general rules (issue 17): a limit is no bar while the project's own lower-priority
work could make room under it, and no victim set takes what the rules protect."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.core import EvictReason, schedule
from gpupool.sim.apply import apply_decision
from tests.core import invariants
from tests.core.builders import Cluster, Run

SETTINGS = settings(deadline=None, derandomize=True, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
PRIORITIES = ("batch", "interactive", "training", "production")


@SETTINGS
@given(limit=st.integers(2, 8), running=st.integers(1, 8), asks=st.integers(1, 8), spread=st.booleans())
def test_a_workload_over_its_limit_is_admitted_when_its_projects_own_lower_priority_work_makes_room(
    limit: int, running: int, asks: int, spread: bool
) -> None:
    running, asks = min(running, limit), min(asks, limit)
    # Over the limit with the new workload, yet within it once some of the batch work goes.
    c = Cluster().pool("h100", nodes=2, gpus=8).project("a", deserved=1, limit=limit)
    for i in range(running):
        c.running(f"s{i}", "a", f"h100-{i % 2 if spread else 0}", [i // 2 if spread else i], gpus=1, priority="batch")
    run = Run(c.snapshot())
    run.submit(c, "t", "a", gpus=asks, priority="training")
    run.settle()
    assert "t" in run.running()
    over = max(0, running + asks - limit)
    assert sorted(run.evicted()) == sorted(f"s{i}" for i in range(running - over, running))  # the newest
    assert run.used_gpus("a") <= limit


@st.composite
def crowded(draw: st.DrawFn) -> Cluster:
    """Two 4-GPU nodes full of 1-GPU work of two projects (any class, preemptible or not, some inside their
    minimum runtime), then a few waiting workloads of any class."""
    c = Cluster().pool("h100", nodes=2, gpus=4)
    c.project("a", deserved=draw(st.integers(0, 8)), limit=draw(st.sampled_from([None, 3, 5])))
    c.project("b", deserved=draw(st.integers(0, 8)))
    for n in range(2):
        for d in range(4):
            c.running(
                f"r{n}{d}",
                draw(st.sampled_from(["a", "b"])),
                f"h100-{n}",
                [d],
                gpus=1,
                priority=draw(st.sampled_from(PRIORITIES)),
                preemptible=draw(st.sampled_from([None, False])),
                min_runtime=draw(st.sampled_from([0.0, 0.0, 600.0])),
            )
    for i in range(draw(st.integers(1, 4))):
        c.submit(
            f"w{i}",
            draw(st.sampled_from(["a", "b"])),
            gpus=draw(st.integers(1, 4)),
            workers=draw(st.sampled_from([1, 1, 2])),
            priority=draw(st.sampled_from(PRIORITIES)),
        )
    return c


@SETTINGS
@given(crowded())
def test_no_victim_is_non_preemptible_or_inside_its_minimum_runtime_unless_owed(c: Cluster) -> None:
    snapshot = c.snapshot()
    for _ in range(3):
        decision = schedule(snapshot)
        invariants.check_decision(snapshot, decision)  # preemptible victims; min runtimes kept unless owed
        by_id = {w.id: w for w in snapshot.workloads}
        for e in decision.evictions:
            v, pre = by_id[e.workload], by_id[e.preemptor or ""]
            assert v.preemptible
            if e.reason is EvictReason.PREEMPT:
                assert invariants.past_min_runtime(v, snapshot.now), f"preempted {v.id} inside its minimum runtime"
                assert v.project == pre.project and v.priority < pre.priority
        snapshot = apply_decision(snapshot, decision, snapshot.now + 1)  # quotas: the drawn start may break them
