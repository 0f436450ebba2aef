"""Property tests on full clusters where a project is owed GPUs: the ground of mixed victim sets and moves.

The general property tests rarely fill every node, so these draw clusters that are: each node shared by a
project within its deserved quota (its work may be moved, not reclaimed) and a borrower, with an owed
project arriving. Every invariant is checked after each cycle, and the cluster must settle.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core import (
    MILLI,
    Device,
    DeviceShare,
    Node,
    Placement,
    PoolSettings,
    Queue,
    Quota,
    Request,
    SchedulerConfig,
    Snapshot,
    State,
    Workload,
    policy_names,
)
from tests.core.test_properties import MAX_MIN_RUNTIME, SETTINGS, Scenario, Step, checked_cycle, settle

GPUS = 4
MEMORY = 80 * 1024
NOW = 1000.0


def running(wid: str, project: str, node: str, index: int, milli: int, min_runtime: float, age: float) -> Workload:
    request = Request(gpus=1) if milli == MILLI else Request(gpu_milli=milli)
    share = DeviceShare(index, *((MILLI, MEMORY) if milli == MILLI else request.share_on(MEMORY)))
    return Workload(
        wid, project, request, min_runtime_s=min_runtime, state=State.RUNNING,
        placements=(Placement(0, node, (share,)),), start_time=NOW - age, submit_time=NOW - age,
    )  # fmt: skip


@st.composite
def crowded_st(draw: st.DrawFn) -> Scenario:
    count = draw(st.integers(2, 4))
    nodes = tuple(
        Node(f"n{i}", "p0", 64_000, 512 * 1024, tuple(Device(d, "H100", MEMORY) for d in range(GPUS)))
        for i in range(count)
    )
    whole = st.integers(2, GPUS).map(lambda g: Request(gpus=g))
    share = st.integers(100, 900).map(lambda m: Request(gpu_milli=m))
    arrivals = draw(st.lists(st.one_of(whole, whole, share), min_size=1, max_size=3))
    # Owed what arrives (or a GPU less, so that it is owed part of it only), the holder up to a GPU a node.
    asked = -(-sum(r.nominal_milli() for r in arrivals) // MILLI) * MILLI
    owed = max(MILLI, asked - draw(st.sampled_from((0, 0, 0, MILLI))))
    holder, borrower = draw(st.integers(count, 2 * count)) * MILLI, draw(st.integers(0, 1)) * MILLI
    departments = draw(st.booleans())
    queues = [
        Queue("owed", "d0" if departments else None, {"p0": Quota(owed)}),
        Queue("holder", "d0" if departments else None, {"p0": Quota(holder)}),
        Queue("borrower", "d1" if departments else None, {"p0": Quota(borrower)}),
    ]
    if departments:
        queues += [Queue("d0", None, {"p0": Quota(owed + holder)}), Queue("d1", None, {"p0": Quota(borrower)})]
    work: list[Workload] = []
    held = 0
    for node in nodes:
        for d in range(GPUS):
            # Whole GPUs or two halves: the holder's (within its quota), the borrower's, or free. The holder
            # has work on every node's first GPU, so that emptying a node takes moves.
            shapes = ("holder", "halves") if d == 0 else ("borrower",) * 4 + ("holder", "halves", "free")
            shape = draw(st.sampled_from(shapes))
            parts = [(MILLI // 2, "holder"), (MILLI // 2, "borrower")] if shape == "halves" else [(MILLI, shape)]
            for milli, project in parts:
                if project == "free":
                    continue
                if project == "holder" and held + milli > holder:
                    project = "borrower"
                held += milli if project == "holder" else 0
                min_runtime = draw(st.sampled_from((0.0, MAX_MIN_RUNTIME)))
                age = float(draw(st.integers(0, 60)))
                work.append(running(f"r{len(work):02d}", project, node.name, d, milli, min_runtime, age))
    work += [Workload(f"a{i}", "owed", r, submit_time=NOW) for i, r in enumerate(arrivals)]
    config = SchedulerConfig(policy=draw(st.sampled_from(policy_names())), seed=draw(st.integers(0, 9)))
    steps = tuple(Step(float(draw(st.integers(1, 20))), (), ()) for _ in range(draw(st.integers(1, 4))))
    # Its halves share devices across projects: where the pool does not allow that, what runs stays, but no
    # new share may join another project's (checked on every decision).
    sharing = {"p0": PoolSettings(share_across_projects=draw(st.booleans()))}
    return Scenario(Snapshot(nodes, tuple(queues), tuple(work), now=NOW, pool_settings=sharing), steps, config)


@settings(SETTINGS, max_examples=500)
@given(crowded_st())
def test_a_full_cluster_with_an_owed_project_keeps_every_invariant_and_settles(scenario: Scenario) -> None:
    snapshot = scenario.snapshot
    for step in scenario.steps:
        _, snapshot = checked_cycle(snapshot, scenario.config, step.advance)
    settle(snapshot, scenario.config)
