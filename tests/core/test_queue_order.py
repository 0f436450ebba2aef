"""Queue order: the tree walked level by level by share ratio; at an equal share the earliest head goes first."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from gpupool.core import Decision, SchedulerConfig, Workload, schedule
from gpupool.core.ordering import FairOrder, workload_key
from gpupool.core.session import Session, open_session
from gpupool.core.state import WorkloadState
from tests.core import invariants
from tests.core.builders import Cluster, Run
from tests.core.test_properties import SETTINGS

ALLOCATE = SchedulerConfig(actions=("allocate",))
"""Free capacity only: who goes first decides who gets it."""


def bound(decision: Decision) -> list[str]:
    return [b.workload for b in decision.binds]


def test_at_an_equal_share_the_project_whose_head_came_first_goes_first() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=1).project("alpha", deserved=1).project("beta", deserved=1)
    c.submit("b1", "beta", gpus=1).submit("a1", "alpha", gpus=1)  # beta's waited longer; alpha's name sorts first
    assert bound(schedule(c.snapshot(), ALLOCATE)) == ["b1"]


def test_the_head_is_the_workload_the_project_sends_next_not_its_oldest() -> None:
    # alpha's oldest is batch, behind its newer training job: its head came after beta's.
    c = Cluster().pool("h100", nodes=1, gpus=1).project("alpha", deserved=1).project("beta", deserved=1)
    c.submit("a-old", "alpha", gpus=1, priority="batch").submit("b1", "beta", gpus=1)
    c.submit("a-new", "alpha", gpus=1)
    assert bound(schedule(c.snapshot(), ALLOCATE)) == ["b1"]


def test_departments_take_turns_by_their_own_share_ratio() -> None:
    # d1 is at its deserved quota (a2 borrows from a1), d2 below it: d2 goes first, though a1 has used nothing.
    c = Cluster().pool("h100", nodes=2, gpus=4).department("d1", deserved=4).department("d2", deserved=4)
    c.project("a1", department="d1", deserved=2).project("a2", department="d1", deserved=2)
    c.project("b1", department="d2", deserved=4)
    c.running("a2-run", "a2", "h100-0", [0, 1, 2, 3], gpus=4).running("b1-run", "b1", "h100-1", [0, 1, 2], gpus=3)
    c.submit("a1-wait", "a1", gpus=1).submit("b1-wait", "b1", gpus=1)
    assert bound(schedule(c.snapshot(), ALLOCATE)) == ["b1-wait"]


def test_within_a_department_projects_take_turns_by_their_share_ratio() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=4).department("d", deserved=4)
    c.project("a", department="d", deserved=2).project("b", department="d", deserved=2)
    c.running("a-run", "a", "h100-0", [0], gpus=1).running("b-run", "b", "h100-0", [1, 2], gpus=2)
    c.submit("b-wait", "b", gpus=1).submit("a-wait", "a", gpus=1)
    assert bound(schedule(c.snapshot(), ALLOCATE)) == ["a-wait"]


def test_departments_at_an_equal_share_go_by_the_head_they_would_send() -> None:
    # d1 and d2 stand alike (1 GPU used of a 1.5 fair share each). d1 would send x, idle, whose head x1 came
    # after d2's y1; z's head came first of all, but z is served after x, so it does not speak for d1.
    c = Cluster().pool("h100", nodes=1, gpus=3).department("d1", deserved=2).department("d2", deserved=2)
    c.project("x", department="d1", deserved=1).project("z", department="d1", deserved=1)
    c.project("y", department="d2", deserved=2)
    c.running("z-run", "z", "h100-0", [0], gpus=1).running("y-run", "y", "h100-0", [1], gpus=1)
    c.submit("z1", "z", gpus=1).submit("y1", "y", gpus=1).submit("x1", "x", gpus=1).submit("y2", "y", gpus=1)
    assert bound(schedule(c.snapshot(), ALLOCATE)) == ["y1"]


def test_below_deserved_still_goes_first() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=4).project("a", deserved=1).project("b", deserved=3)
    c.running("a-run", "a", "h100-0", [0], gpus=1).running("b-run", "b", "h100-0", [1, 2], gpus=2)
    c.submit("a-wait", "a", gpus=1).submit("b-wait", "b", gpus=1)  # a waited longer, but b is owed
    assert bound(schedule(c.snapshot(), ALLOCATE)) == ["b-wait"]


def test_a_project_that_places_nothing_yields_to_an_earlier_head() -> None:
    # alpha's head does not fit; its next workload came after beta's head, which goes before it.
    c = Cluster().pool("h100", nodes=1, gpus=1).project("alpha", deserved=1).project("beta", deserved=1)
    c.submit("a-big", "alpha", gpus=2).submit("b1", "beta", gpus=1).submit("a-small", "alpha", gpus=1)
    assert bound(schedule(c.snapshot(), ALLOCATE)) == ["b1"]


# -- the general rule -------------------------------------------------------------------------------------


@st.composite
def equal_projects(draw: st.DrawFn) -> tuple[Cluster, str]:
    """Projects alike in quota, usage and demand, so their share ratios are equal, with pending work submitted
    interleaved at random; one GPU free. Returns the cluster and the project whose head was submitted first."""
    running = draw(st.integers(0, 2))
    # Fair shares split the capacity evenly only where it divides (else a milli goes to the first by position).
    n = draw(st.sampled_from([2, 3, 4] if running == 0 else [2, 4]))
    per_project = draw(st.integers(1, 3))
    deserved = draw(st.sampled_from([0, 1, 4]))
    names = [f"p{i}" for i in range(n)]
    c = Cluster().pool("h100", nodes=1, gpus=n * running + 1)
    for name in names:
        c.project(name, deserved=deserved)
    device = 0
    for name in names:
        for k in range(running):
            c.running(f"{name}-run{k}", name, "h100-0", [device], gpus=1)
            device += 1
    jobs = [(name, k) for name in names for k in range(per_project)]
    order = draw(st.permutations(jobs))
    priorities = draw(
        st.lists(st.sampled_from(["training", "interactive", "batch"]), min_size=len(jobs), max_size=len(jobs))
    )
    for (name, k), priority in zip(order, priorities, strict=True):
        c.submit(f"{name}-w{k}", name, gpus=1, priority=priority)
    pending = [w for w in c.workloads if w.start_time is None]
    heads = {name: min((w for w in pending if w.project == name), key=head_rank) for name in names}
    first = min(names, key=lambda name: heads[name].submit_time)
    return c, first


def head_rank(w: Workload) -> tuple[int, float, str]:
    return (-w.priority, w.submit_time, w.id)


@SETTINGS
@given(equal_projects())
def test_at_an_equal_share_ratio_the_project_whose_head_came_first_is_served_first(case: tuple[Cluster, str]) -> None:
    cluster, first = case
    snap = cluster.snapshot()
    decision = schedule(snap, ALLOCATE)
    invariants.check_decision(snap, decision)
    [placed] = decision.binds
    assert next(w.project for w in snap.workloads if w.id == placed.workload) == first


def test_the_order_settles() -> None:
    c = Cluster().pool("h100", nodes=2, gpus=4).department("d1", deserved=4).department("d2", deserved=4)
    c.project("a1", department="d1", deserved=2).project("a2", department="d1", deserved=2)
    c.project("b1", department="d2", deserved=4)
    for i in range(4):
        c.submit(f"a1-{i}", "a1", gpus=1).submit(f"a2-{i}", "a2", gpus=2).submit(f"b1-{i}", "b1", gpus=1)
    Run(c.snapshot()).settle()


# -- the order itself, against a plain reading of the rule --------------------------------------------------------


def first_by_rule(session: Session, lists: dict[int, list[WorkloadState]]) -> WorkloadState | None:
    """The next workload by the rule read literally: from the top, at every level the member with waiting work
    whose (below deserved, used / fair, head's submit time, head's id) is least; heads by priority then age."""
    tree, pools = session.state.tree, session.state.pools

    def share(q: int) -> tuple[int, float]:
        used = sum(session.state.used[q])
        deserved = sum(tree.queues[q].quota(p).deserved for p in pools)
        fair = sum(session.fair[q])
        return (0 if used < deserved else 1, used / fair if fair else float("inf"))

    def head(q: int) -> WorkloadState | None:
        if q in lists:
            return min(lists[q], key=workload_key) if lists[q] else None
        return pick(tree.children[q])

    def pick(members: list[int]) -> WorkloadState | None:
        ranked = [(share(q), h.w.submit_time, h.w.id, h) for q in members for h in (head(q),) if h is not None]
        return min(ranked, key=lambda r: r[:3])[3] if ranked else None

    return pick(tree.roots)


@st.composite
def trees_and_turns(draw: st.DrawFn) -> tuple[Cluster, list[int]]:
    """Departments two levels deep, projects under them or at the top, random quotas and pending work; then for
    each turn how much the served project places (0: nothing)."""
    c = Cluster().pool("h100", nodes=4, gpus=8)
    c.department("top", deserved=draw(st.integers(0, 16)))
    c.department("mid", deserved=draw(st.integers(0, 8)))
    c.queues["mid"] = dataclasses.replace(c.queues["mid"], parent="top")
    parents = [None, "top", "mid"]
    projects = [f"p{i}" for i in range(draw(st.integers(1, 5)))]
    for name in projects:
        c.project(name, department=draw(st.sampled_from(parents)), deserved=draw(st.integers(0, 4)))
    for i in range(draw(st.integers(1, 14))):
        priority = draw(st.sampled_from(["training", "batch"]))
        c.submit(f"w{i:02d}", draw(st.sampled_from(projects)), gpus=1, priority=priority)
    turns = draw(st.lists(st.sampled_from([0, 0, 500, 1000]), min_size=14, max_size=14))
    return c, turns


@SETTINGS
@given(trees_and_turns())
def test_the_order_is_the_rule_turn_by_turn(case: tuple[Cluster, list[int]]) -> None:
    cluster, turns = case
    session = open_session(cluster.snapshot(), SchedulerConfig())
    waiting = session.waiting()
    lists: dict[int, list[WorkloadState]] = {}
    for ws in waiting:
        lists.setdefault(ws.queue, []).append(ws)
    order = FairOrder(session, waiting)
    for turn, ws in zip(turns * 2, order, strict=False):
        assert ws is first_by_rule(session, lists)
        lists[ws.queue].remove(ws)
        for q in session.state.tree.chain[ws.queue]:  # as a placement charges the project and its departments
            session.state.used[q][0] += turn
        order.unchanged = turn == 0
