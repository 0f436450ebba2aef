"""What a gap beside a share is worth, learned from the typical mix, and how the default policy uses it."""

import dataclasses

import pytest

from gpupool.core import MILLI, DeviceShare, Placement, Request, SchedulerConfig, State
from gpupool.core.placement.gaps import ExpectedIdle, gap_waste, gpu_shapes
from gpupool.core.placement.policies import TypicalMix
from tests.core.builders import Cluster, Run


def mix(*shapes: tuple[float, int], cpus: int = 0) -> TypicalMix:
    """(GPUs, weight): a whole number of GPUs, or a share below one; each with `cpus` CPUs."""
    cpu = cpus * 1000
    return tuple(
        (Request(gpus=int(g), cpu_milli=cpu) if g >= 1 else Request(gpu_milli=round(g * MILLI), cpu_milli=cpu), w)
        for g, w in shapes
    )


def shapes_of(*shapes: tuple[float, int]) -> tuple[tuple[int, int, int], ...]:
    return gpu_shapes(mix(*shapes))


def test_a_gap_no_share_in_the_mix_fits_stays_idle() -> None:
    waste = gap_waste(shapes_of((0.81, 10), (0.47, 10), (1, 20)))
    assert waste[190] == 190  # beside a 0.81: nothing in the mix is that small
    assert waste[MILLI] == 0  # a whole free GPU is not a sliver: whole-GPU work takes it


def test_a_gap_a_common_share_closes_costs_what_the_pair_leaves() -> None:
    waste = gap_waste(shapes_of((0.81, 10), (0.47, 10), (1, 20)))
    assert 60 <= waste[530] < 100  # another 0.47 closes it, leaving 0.06; a few are still open at the end
    assert waste[60] == 60


def test_the_table_is_a_function_of_the_mix() -> None:
    shapes = shapes_of((0.32, 10), (0.47, 10), (0.65, 10), (1, 20))
    assert gap_waste(shapes) == gap_waste(shapes)
    assert gap_waste(shapes) != gap_waste(shapes_of((0.81, 10), (0.47, 10), (1, 20)))


def test_one_more_workload_of_a_common_shape_keeps_the_table() -> None:
    assert shapes_of((0.5, 1000), (1, 1000)) == shapes_of((0.5, 1001), (1, 1000)) == ((0, 500, 500), (1, 0, 500))
    assert shapes_of((0.5, 1000), (1, 1000)) != shapes_of((0.5, 1100), (1, 1000))


def test_without_shares_every_gap_is_taken_as_idle() -> None:
    waste = gap_waste(shapes_of((1, 5), (2, 1)))
    assert waste == (*range(MILLI), 0)
    assert gap_waste(()) == waste


def two_gpus_after_a_small_share(policy: str) -> tuple[Cluster, Run]:
    """A 0.32 share runs on one of two free GPUs; then a 0.47 share comes."""
    c = Cluster().pool("a100", nodes=1, gpus=2).project("a", deserved=2)
    c.submit("small", "a", gpu=0.32)
    config = SchedulerConfig(policy=policy, typical_mix=mix((0.32, 10), (0.47, 10), (0.65, 10), (1, 20)))
    run = Run(c.snapshot(), config).settle()
    return c, run.submit(c, "mid", "a", gpu=0.47).settle()


def device(run: Run, wid: str) -> int:
    return run.workload(wid).placements[0].devices[0].index


def test_a_share_opens_a_fresh_gpu_rather_than_leave_a_gap_nothing_fits() -> None:
    # Beside the 0.32 a 0.47 would leave 0.21, which nothing in the mix fits; a 0.65 closes the 0.68 instead.
    c, run = two_gpus_after_a_small_share("gpupool")
    assert device(run, "mid") != device(run, "small")
    run.submit(c, "large", "a", gpu=0.65).settle()
    assert device(run, "large") == device(run, "small")  # 0.03 idle there, 0.53 left for another 0.47


def test_best_fit_takes_the_smallest_gap_and_strands_the_rest() -> None:
    c, run = two_gpus_after_a_small_share("bestfit")
    assert device(run, "mid") == device(run, "small")
    run.submit(c, "large", "a", gpu=0.65).settle()
    assert device(run, "large") != device(run, "small")  # 0.21 idle beside the pair, 0.35 beside the 0.65


def test_a_share_does_not_take_the_last_cpus_beside_gpus_others_could_use() -> None:
    # p-0 has 8 CPUs and two GPUs: a 0.47 share with 4 CPUs on one. Another 0.47 with 4 CPUs would close
    # that gap, but take the node's last CPUs and strand its other GPU. p-1 has CPUs to spare.
    c = Cluster().pool("p", nodes=1, gpus=2, cpus=8).pool("p", nodes=1, gpus=2, cpus=64).project("a", deserved=4)
    c.submit("first", "a", gpu=0.47, cpus=4)
    first = c.workloads[-1]
    c.workloads[-1] = dataclasses.replace(
        first,
        state=State.RUNNING,
        start_time=c.now,
        placements=(Placement(0, "p-0", (DeviceShare(0, 470, 470 * 80 * 1024 // MILLI),)),),
    )
    config = SchedulerConfig(typical_mix=mix((0.47, 10), (1, 10), cpus=4))
    run = Run(c.snapshot(), config).submit(c, "second", "a", gpu=0.47, cpus=4).settle()
    assert run.workload("second").placements[0].node == "p-1"
    run.submit(c, "whole", "a", gpus=1, cpus=4).submit(c, "third", "a", gpu=0.47, cpus=4).settle()
    assert {"whole", "third"} <= run.running()  # p-0 still takes one of them


@pytest.mark.parametrize(
    ("lean_gpus", "lean_cpus", "job_cpus", "goes_to"),
    [
        # An 8-GPU node with 96 CPUs feeds eight typical 11-CPU jobs. A 1-GPU job that wants 24 CPUs fits
        # there as well as on the 2-GPU node with 104 CPUs, and the GPUs' fragmentation is the same either
        # way, but it would leave 72 CPUs for seven GPUs there: one of them would starve.
        (8, 96, 24, "rich-0"),
        # The mirror image: a 3-CPU job goes to the node whose 16 CPUs could feed only one of its two GPUs.
        (2, 16, 3, "lean-0"),
    ],
)
def test_work_goes_where_its_cpus_leave_every_gpu_fed(
    lean_gpus: int, lean_cpus: int, job_cpus: int, goes_to: str
) -> None:
    c = Cluster().pool("rich", nodes=1, gpus=2, cpus=104).pool("lean", nodes=1, gpus=lean_gpus, cpus=lean_cpus)
    c.project("a", deserved=lean_gpus + 2)
    config = SchedulerConfig(typical_mix=mix((1, 10), cpus=11))
    run = Run(c.snapshot(), config).submit(c, "job", "a", gpus=1, cpus=job_cpus).settle()
    assert run.workload("job").placements[0].node == goes_to
    for i in range(lean_gpus + 1):
        run.submit(c, f"typical-{i}", "a", gpus=1, cpus=11)
    assert len(run.settle().running()) == lean_gpus + 2  # every GPU in use


def expected_idle(typical: TypicalMix) -> ExpectedIdle:
    return ExpectedIdle(typical, gap_waste(gpu_shapes(typical)), {})


def test_the_last_cpus_feed_one_gpu_not_every_gpu() -> None:
    # Four free GPUs and 12 free CPUs, where typical work takes 11 CPUs a GPU: one GPU can be fed.
    idle = expected_idle(mix((1, 10), cpus=11))
    assert idle([MILLI] * 4, 12_000, 10**6, 80 * 1024) == 3 * MILLI
    assert idle([MILLI] * 4, 44_000, 10**6, 80 * 1024) == 0


def test_free_cpus_feed_gpus_at_the_mix_rate() -> None:
    # Half the typical work takes 3 CPUs a GPU, half 11: 7 on average. Every GPU could take a 3-CPU job,
    # but 14 CPUs feed two GPUs' worth of the mix, so two are expected to stay idle.
    typical = ((Request(gpus=1, cpu_milli=3000), 10), (Request(gpus=1, cpu_milli=11_000), 10))
    idle = expected_idle(typical)
    assert idle([MILLI] * 4, 14_000, 10**6, 80 * 1024) == 2 * MILLI
    assert idle([MILLI] * 4, 28_000, 10**6, 80 * 1024) == 0
