"""The one applier: a decision carried out on a snapshot as a perfect cluster would, and what it changed."""

from __future__ import annotations

from gpupool.core import (
    MILLI,
    Bind,
    Decision,
    Device,
    DeviceShare,
    Eviction,
    EvictReason,
    Node,
    Pending,
    PendingCode,
    Placement,
    Queue,
    Request,
    Snapshot,
    State,
    Workload,
)
from gpupool.sim.apply import apply, apply_decision

NODES = tuple(Node(f"n{i}", "p0", 8000, 65536, (Device(0, "H100", 81920), Device(1, "H100", 81920))) for i in range(2))


def on(node: str, index: int) -> tuple[Placement, ...]:
    return (Placement(0, node, (DeviceShare(index, MILLI, 81920),)),)


def work(wid: str, state: State = State.PENDING, **kw: object) -> Workload:
    return Workload(wid, "p", Request(gpus=1), state=state, submit_time=1.0, **kw)  # type: ignore[arg-type]


SNAPSHOT = Snapshot(
    NODES,
    (Queue("p"),),
    (
        work("r1", State.RUNNING, placements=on("n0", 0), start_time=5.0),
        work("r2", State.RUNNING, placements=on("n1", 0), start_time=6.0),
        work("q1"),
        work("q2", nominated_nodes=("n1",)),
        work("q3"),
    ),
    now=10.0,
)
DECISION = Decision(
    binds=(Bind("q3", on("n1", 1)), Bind("q1", on("n0", 1))),
    evictions=(
        Eviction("r2", EvictReason.PREEMPT, "preempted"),
        Eviction("r1", EvictReason.CONSOLIDATE, "moved"),
    ),
    pending=(
        Pending("q2", PendingCode.NO_NODE_FITS, "no room"),
        Pending("r1", PendingCode.WAITING_FOR_EVICTIONS, "moving", nominated=on("n1", 0)),
    ),
)


def test_binds_start_now_and_evictions_requeue_keeping_a_moved_workloads_nomination() -> None:
    after = {w.id: w for w in apply_decision(SNAPSHOT, DECISION, 11.0).workloads}
    assert (after["q3"].state, after["q3"].placements, after["q3"].start_time) == (State.RUNNING, on("n1", 1), 11.0)
    assert (after["r1"].state, after["r1"].placements, after["r1"].nominated_nodes) == (State.PENDING, (), ("n1",))
    assert (after["r2"].state, after["r2"].start_time, after["r2"].nominated_nodes) == (State.PENDING, None, ())
    assert after["q2"].nominated_nodes == ()  # no longer nominated: the decision made no room for it
    assert after["r1"].submit_time == 1.0


def test_what_changed_comes_in_the_decisions_order_as_it_was_before_and_after() -> None:
    applied = apply(SNAPSHOT, DECISION)
    assert [w.id for w in applied.started] == ["q3", "q1"]
    assert [(w.placements, w.start_time) for w in applied.started] == [(on("n1", 1), 10.0), (on("n0", 1), 10.0)]
    assert [(w.id, w.placements, w.start_time) for w in applied.evicted] == [
        ("r2", on("n1", 0), 6.0),
        ("r1", on("n0", 0), 5.0),
    ]
    assert applied.snapshot.now == 10.0
    assert [w.id for w in applied.snapshot.workloads] == ["r1", "r2", "q1", "q2", "q3"]
