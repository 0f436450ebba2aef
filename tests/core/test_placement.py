"""Placement policies: packing for whole GPUs, fragmentation-aware fractions, every named policy legal."""

import pytest

from gpupool.core import SchedulerConfig, policy_names
from tests.core.builders import Cluster, Run


def test_every_published_policy_is_available() -> None:
    assert set(policy_names()) == {"random", "dotprod", "clustering", "packing", "bestfit", "fgd", "gpupool"}


def test_unknown_policy_is_refused_with_the_known_names() -> None:
    c = Cluster().pool("h100").project("a")
    with pytest.raises(ValueError, match="known: bestfit"):
        Run(c.snapshot(), SchedulerConfig(policy="tetris")).cycle()


def test_whole_gpus_pack_onto_the_node_with_the_fewest_free() -> None:
    c = Cluster().pool("h100", nodes=3, gpus=8).project("a", deserved=24)
    c.running("big", "a", "h100-1", range(6), gpus=6).running("mid", "a", "h100-2", range(3), gpus=3)
    c.submit("one", "a", gpus=2)
    run = Run(c.snapshot()).settle()
    assert run.workload("one").placements[0].node == "h100-1"  # 2 left there: exactly fills it


def test_fraction_joins_a_shared_device_rather_than_breaking_a_whole_one() -> None:
    c = Cluster().pool("h100", nodes=2, gpus=2).project("a", deserved=4)
    c.submit("f1", "a", gpu=0.5)
    run = Run(c.snapshot()).settle()
    run.submit(c, "f2", "a", gpu=0.5).settle()
    first, second = (run.workload(w).placements[0] for w in ("f1", "f2"))
    assert (first.node, first.devices[0].index) == (second.node, second.devices[0].index)


@pytest.mark.parametrize("policy", sorted(policy_names()))
def test_each_policy_fills_a_mixed_cluster_legally(policy: str) -> None:
    c = Cluster().pool("h100", nodes=3, gpus=4).pool("l40s", nodes=2, gpus=2, model="L40S", gpu_memory_gib=48)
    c.project("a", deserved=8).project("b", deserved=6)
    for i in range(6):
        c.submit(f"w{i}", "a", gpus=1 + i % 2).submit(f"f{i}", "b", gpu=0.3 + 0.1 * (i % 3))
        c.submit(f"m{i}", "b", gpu_memory_gib=10)
    c.submit("ddp", "a", gpus=2, workers=2)
    run = Run(c.snapshot(), SchedulerConfig(policy=policy, seed=3)).settle()
    loads: dict[tuple[str, int], int] = {}
    for w in run.snapshot.workloads:
        for p in w.placements:
            for d in p.devices:
                loads[(p.node, d.index)] = loads.get((p.node, d.index), 0) + d.milli
    assert loads and max(loads.values()) <= 1000
    assert len(run.running()) >= 12
