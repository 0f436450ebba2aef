"""The settling fast paths of allocate and reclaim decide exactly what trying every workload decides.

Seeded nearly full clusters with many pending workloads of mixed shapes (whole GPUs, fractions, memory
requests, gangs, non-preemptible work, pinned pools, strict-FIFO projects, limits), run for a few cycles
with each path; every decision (binds, evictions, nominations, pending codes and messages) must match.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from gpupool.core import (
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
    schedule,
)
from gpupool.core.actions import allocate, reclaim
from gpupool.sim.apply import apply_decision

POOLS = ("a", "b")


def _request(rng: random.Random) -> Request:
    kind = rng.randrange(4)
    cpu, memory = rng.choice((0, 1000, 4000)), rng.choice((0, 4096))
    if kind == 0:
        return Request(gpus=rng.choice((1, 1, 2, 4, 8)), cpu_milli=cpu, memory_mib=memory)
    if kind == 1:
        return Request(gpu_milli=rng.choice((250, 500, 750)), cpu_milli=cpu, memory_mib=memory)
    if kind == 2:
        return Request(gpu_memory_mib=rng.choice((10_240, 40_960)), cpu_milli=cpu, memory_mib=memory)
    return Request(gpus=rng.choice((1, 2)), cpu_milli=cpu, memory_mib=memory)


def _snapshot(seed: int) -> Snapshot:
    rng = random.Random(seed)
    nodes = tuple(
        Node(
            f"n{i:02d}",
            POOLS[i % 2],
            64_000,
            512 * 1024,
            tuple(Device(d, "H100" if i % 3 else "A100", 81_920 if i % 3 else 40_960) for d in range(4)),
        )
        for i in range(12)
    )
    projects = [f"p{i}" for i in range(6)]
    queues = [Queue("d0"), Queue("d1")]
    for i, name in enumerate(projects):
        quotas = {p: Quota(deserved=rng.choice((0, 2000, 4000)), limit=rng.choice((None, None, 12_000))) for p in POOLS}
        queues.append(Queue(name, parent=f"d{i % 2}", quotas=quotas, strict_fifo=i == 5))
    snap = Snapshot(nodes, tuple(queues), (), now=100.0, pool_settings={"b": PoolSettings(share_across_projects=False)})
    # Fill most of the cluster by scheduling a first wave, then queue many more.
    first = [_workload(rng, f"r{i:03d}", projects, 0.0) for i in range(70)]
    snap = Snapshot(snap.nodes, snap.queues, tuple(first), now=100.0, pool_settings=snap.pool_settings)
    snap = apply_decision(snap, schedule(snap), now=200.0)
    more = [_workload(rng, f"w{i:04d}", projects, 150.0 + i) for i in range(400)]
    return Snapshot(snap.nodes, snap.queues, snap.workloads + tuple(more), now=200.0, pool_settings=snap.pool_settings)


def _workload(rng: random.Random, wid: str, projects: list[str], submit: float) -> Workload:
    request = _request(rng)
    gang = rng.choice((1, 1, 1, 2, 3)) if request.gpus else 1
    return Workload(
        wid,
        rng.choice(projects),
        request,
        priority=rng.choice((10, 50, 50, 90)),
        preemptible=rng.random() < 0.8,
        gang_size=gang,
        pools=rng.choice(((), (), ("a",), ("b",), ("b", "a"))),
        gpu_models=rng.choice(((), (), ("A100",))),
        submit_time=submit,
    )


def _run(snapshot: Snapshot, settle: bool, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    monkeypatch.setattr(allocate, "SETTLE", settle)
    monkeypatch.setattr(reclaim, "SETTLE", settle)
    out: list[object] = []
    config = SchedulerConfig(max_preemption_attempts=20)
    for cycle in range(4):
        decision = schedule(snapshot, config)
        out.append((decision.binds, decision.evictions, decision.pending, decision.shares))
        snapshot = apply_decision(snapshot, decision, now=snapshot.now + 60.0 * (cycle + 1))
    return out


def _full_snapshot(seed: int) -> Snapshot:
    """The live benchmark's shape: every GPU but a few held by one-GPU work (some of it still releasing),
    thousands pending of a few sizes over ten projects (one strict-FIFO, one limited, one with shares), so
    that a project's turns change nothing again and again."""
    rng = random.Random(seed)
    nodes = tuple(
        Node(f"n{i:02d}", "a", 128_000, 1024 * 1024, tuple(Device(d, "H100", 81_920) for d in range(8)))
        for i in range(16)
    )
    projects = [f"p{i}" for i in range(10)]
    queues = [Queue("d")]
    for i, name in enumerate(projects):
        quota = Quota(deserved=rng.choice((0, 8000, 16_000)), limit=30_000 if i == 3 else None)
        queues.append(Queue(name, parent="d", quotas={"a": quota}, strict_fifo=i == 5))
    running: list[Workload] = []
    for n in range(125):
        placement = Placement(0, f"n{n // 8:02d}", (DeviceShare(n % 8, 1000, 81_920),))
        state = State.RELEASING if n % 20 == 7 else State.RUNNING
        running.append(
            Workload(
                f"r{n:03d}", projects[n % 10], Request(gpus=1, cpu_milli=1000, memory_mib=4096),
                state=state, placements=(placement,), start_time=0.0, submit_time=0.0,
            )
        )  # fmt: skip
    pending = [
        Workload(
            f"w{i:04d}", projects[i % 10],
            Request(gpus=rng.choice((1, 1, 1, 1, 1, 1, 1, 2, 4, 8)), cpu_milli=1000, memory_mib=4096)
            if i % 50 else Request(gpu_milli=500, cpu_milli=1000, memory_mib=4096),
            priority=rng.choice((50, 50, 50, 90)), submit_time=10.0 + i,
        )
        for i in range(3000)
    ]  # fmt: skip
    return Snapshot(nodes, tuple(queues), tuple(running + pending), now=100.0)


CASES = [(_snapshot, seed) for seed in range(6)] + [(_full_snapshot, seed) for seed in range(3)]
"""Mixed shapes in a nearly full cluster; the live benchmark's shape, with releasing work to pipeline onto."""


@pytest.mark.parametrize(("build", "seed"), CASES, ids=[f"{b.__name__.strip('_')}-{s}" for b, s in CASES])
def test_settling_decides_as_trying_every_workload(
    build: Callable[[int], Snapshot], seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot = build(seed)
    plain = _run(snapshot, False, monkeypatch)
    fast = _run(snapshot, True, monkeypatch)
    assert fast == plain
