"""Fractional GPUs: by share and by memory, never mixed with whole allocations, never over a device."""

from gpupool.core import MILLI
from tests.core.builders import Cluster, Run


def device_loads(run: Run) -> dict[tuple[str, int], int]:
    loads: dict[tuple[str, int], int] = {}
    for w in run.snapshot.workloads:
        for p in w.placements:
            for d in p.devices:
                loads[(p.node, d.index)] = loads.get((p.node, d.index), 0) + d.milli
    return loads


def test_four_quarter_notebooks_share_one_device_and_a_fifth_waits() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=1).project("a", deserved=1)
    for i in range(5):
        c.submit(f"nb{i}", "a", gpu=0.25, priority="interactive")
    run = Run(c.snapshot()).settle()
    assert run.running() == {"nb0", "nb1", "nb2", "nb3"}
    assert device_loads(run) == {("h100-0", 0): MILLI}
    assert run.reason("nb4") == "no-node-fits"


def test_whole_and_fractional_never_share_a_device() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=2).project("a", deserved=2)
    c.submit("half", "a", gpu=0.5).submit("whole1", "a", gpus=1).submit("whole2", "a", gpus=1)
    run = Run(c.snapshot()).settle()
    assert run.running() == {"half", "whole1"}
    assert "whole2" in run.pending()


def test_fractions_pack_onto_a_shared_device_before_opening_a_new_one() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=4).project("a", deserved=4)
    c.submit("f1", "a", gpu=0.5).submit("f2", "a", gpu=0.5).submit("w", "a", gpus=3)
    run = Run(c.snapshot()).settle()
    assert run.running() == {"f1", "f2", "w"}


def test_memory_request_takes_its_share_of_the_device_memory() -> None:
    c = Cluster().pool("l40s", nodes=1, gpus=1, model="L40S", gpu_memory_gib=48).project("a", deserved=1)
    c.submit("m1", "a", gpu_memory_gib=20).submit("m2", "a", gpu_memory_gib=20).submit("m3", "a", gpu_memory_gib=20)
    run = Run(c.snapshot()).settle()
    assert run.running() == {"m1", "m2"}
    share = run.workload("m1").placements[0].devices[0]
    assert share.memory_mib == 20 * 1024 and share.milli == 417  # 20/48 rounded up to a milli


def test_fraction_counts_against_quota_in_milli() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=2).project("a", deserved=0.5, limit=0.5)
    c.submit("f1", "a", gpu=0.25).submit("f2", "a", gpu=0.25).submit("f3", "a", gpu=0.25)
    run = Run(c.snapshot()).settle()
    assert run.used_gpus("a") == 0.5
    assert run.reason("f3") == "over-limit"
