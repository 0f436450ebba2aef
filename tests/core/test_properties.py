"""Property tests: random small clusters and workloads driven through cycles, invariants checked after each one."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import TypeVar

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gpupool.core import (
    Decision,
    Device,
    Node,
    PendingCode,
    PoolSettings,
    Queue,
    Quota,
    Request,
    SchedulerConfig,
    Snapshot,
    State,
    Workload,
    policy_names,
    schedule,
)
from gpupool.core.priority import DEFAULT_CLASSES
from gpupool.sim.apply import apply_decision
from tests.core import invariants
from tests.core.builders import Cluster, Run

MODELS = ("A100", "H100")
KINDS = ("whole", "whole", "fraction", "fraction", "memory", "none")
GIB = 1024
MAX_MIN_RUNTIME = 30.0
T = TypeVar("T")

SETTINGS = settings(
    deadline=None,
    derandomize=True,
    phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass(frozen=True)
class Step:
    """What happens before one cycle: time passes, some running workloads finish, new ones arrive."""

    advance: float
    finish: tuple[int, ...]
    """Indices (mod the number running, in id order) of running workloads that finish and are removed."""
    submit: tuple[Workload, ...]


@dataclass(frozen=True)
class Scenario:
    snapshot: Snapshot
    steps: tuple[Step, ...]
    config: SchedulerConfig


# -- strategies -------------------------------------------------------------------------------------------------


@st.composite
def nodes_st(draw: st.DrawFn, pools: tuple[str, ...]) -> tuple[Node, ...]:
    nodes = []
    for i in range(draw(st.integers(1, 6))):
        pool = draw(st.sampled_from(pools))
        model = draw(st.sampled_from(MODELS))
        gpus = draw(st.integers(1, 8))
        if draw(st.booleans()):
            mem = draw(st.sampled_from((16, 40, 80))) * GIB
            devices = tuple(Device(d, model, mem) for d in range(gpus))
        else:
            devices = tuple(
                Device(d, draw(st.sampled_from(MODELS)), draw(st.sampled_from((16, 24, 40, 80))) * GIB)
                for d in range(gpus)
            )
        schedulable = draw(st.sampled_from((True,) * 9 + (False,)))
        nodes.append(
            Node(f"n{i}", pool, draw(st.integers(4, 64)) * 1000, draw(st.integers(16, 512)) * GIB, devices, schedulable)
        )
    return tuple(nodes)


@st.composite
def quota_st(draw: st.DrawFn, most: int) -> Quota:
    deserved = draw(st.integers(0, most // 250)) * 250
    limit = draw(st.one_of(st.none(), st.integers(0, 32).map(lambda n: deserved + n * 250)))
    return Quota(deserved, limit, draw(st.integers(0, 4)))


@st.composite
def queues_st(draw: st.DrawFn, pools: tuple[str, ...]) -> tuple[Queue, ...]:
    queues: list[Queue] = []
    for d in range(draw(st.integers(1, 3))):
        dept = f"d{d}"
        dq: dict[str, Quota] = {}
        for pool in pools:
            if draw(st.integers(0, 5)):
                dq[pool] = draw(quota_st(16_000))
        queues.append(Queue(dept, None, dq))
        left = {pool: dq[pool].deserved if pool in dq else 0 for pool in pools}
        for p in range(draw(st.integers(1, 3))):
            pq: dict[str, Quota] = {}
            for pool in pools:
                if draw(st.integers(0, 5)):
                    pq[pool] = draw(quota_st(left[pool]))
                    left[pool] -= pq[pool].deserved
            queues.append(Queue(f"{dept}p{p}", dept, pq, strict_fifo=draw(st.sampled_from((False,) * 4 + (True,)))))
    return tuple(queues)


@st.composite
def request_st(draw: st.DrawFn) -> Request:
    kind = draw(st.sampled_from(KINDS))
    cpu = draw(st.sampled_from((0, 0, 500, 1000, 4000, 16000)))
    mem = draw(st.sampled_from((0, 0, 1, 8, 64))) * GIB
    if kind == "whole":
        return Request(gpus=draw(st.integers(1, 8)), cpu_milli=cpu, memory_mib=mem)
    if kind == "fraction":
        return Request(gpu_milli=draw(st.integers(1, 999)), cpu_milli=cpu, memory_mib=mem)
    if kind == "memory":
        return Request(gpu_memory_mib=draw(st.integers(1, 80 * GIB)), cpu_milli=cpu, memory_mib=mem)
    return Request(cpu_milli=max(cpu, 100), memory_mib=mem)


@st.composite
def workload_st(draw: st.DrawFn, projects: tuple[str, ...], pools: tuple[str, ...]) -> Workload:
    cls = draw(st.sampled_from(DEFAULT_CLASSES))
    priority = draw(st.one_of(st.just(cls.value), st.integers(1, 150)))
    preemptible = draw(st.one_of(st.just(cls.preemptible), st.booleans()))
    min_runtime = draw(st.sampled_from((0.0, 0.0, 5.0, MAX_MIN_RUNTIME)))
    gang = draw(st.sampled_from((1, 1, 1, 2, 3, 4)))
    want_pools: tuple[str, ...] = ()
    if draw(st.integers(0, 3)) == 0:
        want_pools = tuple(draw(st.permutations(pools))[: draw(st.integers(1, len(pools)))])
    models: tuple[str, ...] = ()
    if draw(st.integers(0, 3)) == 0:
        models = draw(st.sampled_from(((MODELS[0],), (MODELS[1],), MODELS)))
    return Workload(
        "",
        draw(st.sampled_from(projects)),
        draw(request_st()),
        priority=priority,
        priority_class=cls.name,
        preemptible=preemptible,
        min_runtime_s=min_runtime,
        gang_size=gang,
        pools=want_pools,
        gpu_models=models,
    )


@st.composite
def scenario_st(draw: st.DrawFn, max_steps: int = 6, arrivals: bool = True) -> Scenario:
    pools = ("p0", "p1")[: draw(st.integers(1, 2))]
    nodes = draw(nodes_st(pools))
    queues = draw(queues_st(pools))
    projects = tuple(q.name for q in queues if q.parent is not None)
    work = workload_st(projects, pools)
    now = 1000.0
    drawn = draw(st.lists(work, min_size=1, max_size=12))
    initial = [dataclasses.replace(w, id=f"w{i:02d}", submit_time=now) for i, w in enumerate(drawn)]
    steps = []
    count = len(initial)
    for _ in range(draw(st.integers(1, max_steps))):
        new = draw(st.lists(work, max_size=4)) if arrivals else []
        submit = tuple(dataclasses.replace(w, id=f"w{count + i:02d}") for i, w in enumerate(new))
        count += len(submit)
        finish = tuple(draw(st.lists(st.integers(0, 20), max_size=2))) if arrivals else ()
        steps.append(Step(float(draw(st.integers(1, 20))), finish, submit))
    actions = SchedulerConfig().actions + (("consolidate",) if draw(st.booleans()) else ())
    policy = draw(st.sampled_from(policy_names()))
    config = SchedulerConfig(policy=policy, actions=actions, seed=draw(st.integers(0, 9)))
    sharing = {pool: PoolSettings(share_across_projects=draw(st.booleans())) for pool in pools}
    return Scenario(Snapshot(nodes, queues, tuple(initial), now=now, pool_settings=sharing), tuple(steps), config)


# -- driving ----------------------------------------------------------------------------------------------------


def arrive(snapshot: Snapshot, step: Step) -> Snapshot:
    """Finish the chosen running workloads (they leave the snapshot) and submit the new ones."""
    run = sorted(w.id for w in snapshot.workloads if w.state is State.RUNNING)
    gone = {run[i % len(run)] for i in step.finish} if run else set()
    kept = tuple(w for w in snapshot.workloads if w.id not in gone)
    new = tuple(dataclasses.replace(w, submit_time=snapshot.now) for w in step.submit)
    return dataclasses.replace(snapshot, workloads=kept + new)


def checked_cycle(snapshot: Snapshot, config: SchedulerConfig, advance: float) -> tuple[Decision, Snapshot]:
    """One cycle with every invariant checked on the decision and on the snapshot it leads to."""
    decision = schedule(snapshot, config)
    invariants.check_decision(snapshot, decision)
    after = apply_decision(snapshot, decision, snapshot.now + advance)
    invariants.check_capacity(after)
    invariants.check_running(after)
    invariants.check_quotas(after)
    return decision, after


def settle(snapshot: Snapshot, config: SchedulerConfig) -> Snapshot:
    """Checked cycles until one changes nothing (at most 30).

    A bound workload starts when the decision is applied, at the next cycle's time; jumping past the longest
    min runtime before every cycle keeps "nothing changed" from meaning "protected for a few more seconds".
    """
    advance = MAX_MIN_RUNTIME + 1
    for _ in range(30):
        snapshot = dataclasses.replace(snapshot, now=snapshot.now + advance)
        decision, snapshot = checked_cycle(snapshot, config, advance)
        if not decision.binds and not decision.evictions:
            return snapshot
    raise AssertionError("no steady state after 30 cycles")


def mix(items: tuple[T, ...], rng: random.Random) -> tuple[T, ...]:
    out = list(items)
    rng.shuffle(out)
    return tuple(out)


def shuffled(snapshot: Snapshot, rng: random.Random) -> Snapshot:
    return dataclasses.replace(
        snapshot,
        nodes=mix(snapshot.nodes, rng),
        queues=mix(snapshot.queues, rng),
        workloads=mix(snapshot.workloads, rng),
    )


# -- properties -------------------------------------------------------------------------------------------------


@settings(SETTINGS, max_examples=250)
@given(scenario_st())
def test_invariants_hold_after_every_cycle(scenario: Scenario) -> None:
    snapshot = scenario.snapshot
    for step in scenario.steps:
        snapshot = arrive(snapshot, step)
        _, snapshot = checked_cycle(snapshot, scenario.config, step.advance)
        assert invariants.shared_across_projects(snapshot) == []


@settings(SETTINGS, max_examples=100)
@given(scenario_st(max_steps=4), st.randoms(use_true_random=False))
def test_decision_ignores_input_order(scenario: Scenario, rng: random.Random) -> None:
    snapshot = scenario.snapshot
    for step in scenario.steps:
        snapshot = arrive(snapshot, step)
        decision = schedule(snapshot, scenario.config)
        again = schedule(shuffled(snapshot, rng), scenario.config)
        assert again.to_json() == decision.to_json()
        snapshot = apply_decision(snapshot, decision, snapshot.now + step.advance)


@settings(SETTINGS, max_examples=100, phases=(Phase.explicit, Phase.generate, Phase.shrink))
@given(scenario_st(max_steps=3))
def test_settles_and_stays_settled(scenario: Scenario) -> None:
    """Once a cycle changes nothing, five more (long enough apart that min runtimes lapse) change nothing."""
    snapshot = scenario.snapshot
    for step in scenario.steps:
        snapshot = arrive(snapshot, step)
        _, snapshot = checked_cycle(snapshot, scenario.config, step.advance)
    snapshot = settle(snapshot, scenario.config)
    advance = MAX_MIN_RUNTIME + 1
    for i in range(5):
        snapshot = dataclasses.replace(snapshot, now=snapshot.now + advance)
        decision, snapshot = checked_cycle(snapshot, scenario.config, advance)
        assert not decision.binds and not decision.evictions, f"flapping {i + 1} cycles after settling: {decision}"


# -- minimal reproductions of what the properties found (regression tests) ------------------------------------------


def cycles(run: Run, n: int) -> list[tuple[list[str], list[str]]]:
    """(binds, evictions) of the next n cycles."""
    out = []
    for _ in range(n):
        d = run.cycle()
        out.append(([b.workload for b in d.binds], [e.workload for e in d.evictions]))
    return out


def test_bug_consolidate_moves_work_where_its_quota_forbids_it() -> None:
    c = Cluster().pool("p0", nodes=1, gpus=1).pool("p1", nodes=1, gpus=1).project("a", limit=0, pool="p0")
    c.submit("w1", "a", gpus=1).submit("w2", "a", gpus=1)
    config = SchedulerConfig(actions=("stale_gangs", "allocate", "reclaim", "preempt", "consolidate"))
    run = Run(c.snapshot(), config)
    assert cycles(run, 4) == [(["w1"], []), ([], []), ([], []), ([], [])]


def test_bug_reclaim_ignores_strict_fifo() -> None:
    c = Cluster().pool("p0", nodes=1, gpus=2).project("a").project("b", deserved=2, strict_fifo=True)
    c.submit("low", "a", gpus=1, priority="batch")
    run = Run(c.snapshot())
    run.cycle()
    run.submit(c, "head", "b", gpus=3, priority="production")  # never fits: 3 GPUs on a 2-GPU node
    run.submit(c, "next", "b", gpus=2, priority="production")
    run.settle()  # low is reclaimed for next, rebinds while next is queued behind head, is reclaimed again...


def test_bug_waiting_for_evictions_with_none_evicted() -> None:
    c = Cluster().pool("p0", nodes=1, gpus=3).project("a").project("b", deserved=2, strict_fifo=True)
    c.submit("low", "a", gpus=1, priority="batch")
    run = Run(c.snapshot())
    run.cycle()
    run.submit(c, "head", "b", gpus=3, priority="production")  # nonpreemptible over deserved: blocks the FIFO
    run.submit(c, "next", "b", gpus=2, priority="production")
    d = run.cycle()
    p = d.pending_for("next")
    assert p is not None
    assert not (p.code is PendingCode.WAITING_FOR_EVICTIONS and not d.evictions), p.message
