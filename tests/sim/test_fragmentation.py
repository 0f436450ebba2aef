"""The fragmentation the simulator reports is the core's measure (what FGD places by), node state for node state."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gpupool.core import (
    MILLI,
    Device,
    DeviceShare,
    Node,
    Placement,
    Queue,
    Request,
    SchedulerConfig,
    Snapshot,
    State,
    Workload,
    schedule,
)
from gpupool.core.placement.fgd import mix_weight, node_free, weighted_fragment
from gpupool.core.placement.policies import TypicalMix
from gpupool.core.session import open_session
from gpupool.sim.apply import apply
from gpupool.sim.fragmentation import ClusterGpus, typical_mix
from gpupool.sim.pools import shared_pools
from gpupool.sim.traces import load_nodes, load_pods

GIB = 1024
MIX: TypicalMix = (
    (Request(gpu_memory_mib=8 * GIB), 3),
    (Request(gpu_milli=500), 1),
    (Request(gpus=1, cpu_milli=8000), 2),
)
"""A shape asking for GPU memory is where the simulator's old copy of the measure parted from the core's: it
took such a shape for CPU-only work, to which every idle GPU is stranded."""


def core_fragment(snapshot: Snapshot, mix: TypicalMix) -> float:
    """The core's measure of the snapshot's cluster, read off the working state a cycle starts from."""
    nodes = open_session(snapshot, SchedulerConfig()).state.nodes
    return sum(weighted_fragment(*node_free(n), mix) for n in nodes) / mix_weight(mix)


def reported(snapshot: Snapshot, mix: TypicalMix) -> float:
    gpus = ClusterGpus(snapshot.nodes, mix)
    for w in snapshot.workloads:
        gpus.hold(w)
    return gpus.fragment_milli()


def running(wid: str, node: str, request: Request, shares: tuple[DeviceShare, ...]) -> Workload:
    return Workload(wid, "p", request, state=State.RUNNING, placements=(Placement(0, node, shares),), start_time=0.0)


def test_memory_shapes_count_what_a_share_of_that_memory_could_not_use() -> None:
    nodes = (
        Node("a", "p0", 32_000, 256 * GIB, tuple(Device(d, "T4", 16 * GIB) for d in range(4))),
        Node("b", "p0", 8_000, 64 * GIB, tuple(Device(d, "A100", 40 * GIB) for d in range(2))),
        Node("c", "p0", 16_000, 64 * GIB),
    )
    two = (DeviceShare(0, MILLI, 16 * GIB), DeviceShare(1, MILLI, 16 * GIB))
    work = (
        running("w1", "a", Request(gpus=2, cpu_milli=4000), two),
        running("w2", "a", Request(gpu_milli=600, cpu_milli=1000), (DeviceShare(2, 600, 9830),)),
        running("w3", "b", Request(cpu_milli=6000), ()),
    )  # fmt: skip
    snapshot = Snapshot(nodes, (Queue("p"),), work)
    # Node a has [0, 0, 400, 1000] free: 8 GiB is half a T4 (500), so each shape strands the 400 sliver.
    # Node b has two free A100s but 2 CPUs: 8 GiB (200) and a half strand nothing, the 8-CPU GPU all 2000.
    # Node c has no GPU. The old simulator's copy counted a's 1400 and b's 2000 whole for the memory shape:
    # (3 * 1400 + 400 + 2 * 400 + 3 * 2000 + 2 * 2000) / 6 = 2566.67.
    expected = (3 * 400 + 400 + 2 * 400 + 2 * 2000) / 6
    assert reported(snapshot, MIX) == core_fragment(snapshot, MIX) == expected


def test_every_step_of_a_trace_fill_reports_the_cores_measure(small_trace: tuple[Path, Path]) -> None:
    nodes, pods = load_nodes(small_trace[0]), load_pods(small_trace[1])
    mix = typical_mix(pods) + MIX
    config = SchedulerConfig(actions=("allocate",), typical_mix=typical_mix(pods), seed=42)
    snapshot = Snapshot(nodes, (Queue("p"),), (), pool_settings=shared_pools(nodes))
    gpus = ClusterGpus(nodes, mix)
    for start in range(0, 400, 50):
        batch = tuple(
            Workload(f"{i:04d}", "p", pods[i].request(), submit_time=float(i)) for i in range(start, start + 50)
        )
        snapshot = replace(snapshot, workloads=snapshot.workloads + batch)
        applied = apply(snapshot, schedule(snapshot, config))
        snapshot = replace(applied.snapshot, workloads=tuple(w for w in applied.snapshot.workloads if w.placements))
        for w in applied.started:
            gpus.hold(w)
        assert gpus.fragment_milli() == core_fragment(snapshot, mix)
        assert gpus.idle_milli() == sum(sum(node_free(n)[0]) for n in open_session(snapshot, config).state.nodes)
    assert gpus.allocated_milli() > 0
