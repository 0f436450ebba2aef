"""The FGD paper's baseline policies score as its simulator does (hand-computed cases)."""

import math

import pytest

from gpupool.core import Device, Node, Request
from gpupool.core.placement.baselines import BestFitPolicy, ClusteringPolicy, DotProductPolicy, PackingPolicy
from gpupool.core.placement.fgd import FgdPolicy, typical_fragment
from gpupool.core.placement.memo import Memo
from gpupool.core.placement.policies import Policy, PolicyContext
from gpupool.core.state import NodeState


def node(gpus: int = 8, cpu: int = 96_000, used: dict[int, int] | None = None, cpu_used: int = 0) -> NodeState:
    n = NodeState(Node("n", "p", cpu, 512 * 1024, tuple(Device(i, "G2", 16384) for i in range(gpus))), 0, 0)
    for i, milli in (used or {}).items():
        n.device(i).used = milli
        n.device(i).whole = milli == 1000
    n.used_cpu = cpu_used
    return n


def ctx(mix: tuple[tuple[Request, int], ...] = (), on_node: tuple[Request, ...] = ()) -> PolicyContext:
    return PolicyContext(mix=mix, seed=0, max_cpu=128_000, max_gpus=8, memo=Memo(), requests_on=lambda n: on_node)


def score(policy: Policy, n: NodeState, req: Request) -> float:
    found = policy.evaluate(n, req, False, frozenset(), 0)
    assert found is not None
    return found[1]


def test_bestfit() -> None:
    n = node(cpu_used=32_000, used={0: 1000, 1: 500})
    # left after: cpu 64000-8000, gpu 6500-300 -> s = 0.5*56000/128000 + 0.5*6200/8000
    expected = int((1 - (0.5 * 56_000 / 128_000 + 0.5 * 6_200 / 8_000)) * 100)
    assert score(BestFitPolicy(ctx()), n, Request(gpu_milli=300, cpu_milli=8000)) == expected


def test_dotprod() -> None:
    n = node(cpu_used=32_000, used={0: 1000})
    dot = (64_000 / 128_000 * 8_000 / 128_000 + 7_000 / 8_000 * 2_000 / 8_000) / 2
    assert score(DotProductPolicy(ctx()), n, Request(gpus=2, cpu_milli=8000)) == int(100 * (1 - dot))
    assert score(DotProductPolicy(ctx()), node(cpu=4000), Request(gpus=1, cpu_milli=8000)) == 0


@pytest.mark.parametrize(
    ("used", "req", "expected"),
    [
        ({}, Request(gpu_milli=500), max(33 - 8, 8)),  # an idle node
        ({0: 1000}, Request(gpus=2), max(50 - 2, 33)),  # takes two free GPUs of a used node
        ({0: 700}, Request(gpu_milli=200), max(100 - (300 * 100 // 1000) // 10, 50)),  # joins a shared GPU
    ],
)
def test_packing(used: dict[int, int], req: Request, expected: int) -> None:
    assert score(PackingPolicy(ctx()), node(used=used), req) == expected


def test_clustering_prefers_nodes_holding_only_the_same_kind() -> None:
    share = Request(gpu_milli=500)
    same = ClusteringPolicy(ctx(on_node=(share,)))
    mixed = ClusteringPolicy(ctx(on_node=(share, Request(gpus=2))))
    idle = ClusteringPolicy(ctx())
    base = 25 * 500 // 8000
    assert score(same, node(used={0: 500}), share) == base + 75
    assert score(mixed, node(used={0: 500}), share) == base + 50
    assert score(idle, node(), share) == 25


def test_fragment_definition() -> None:
    free = [1000, 1000, 190, 60]
    assert typical_fragment(free, 10_000, 1 << 20, 16384, Request(gpu_milli=470)) == 190 + 60
    assert typical_fragment(free, 10_000, 1 << 20, 16384, Request(gpus=3)) == 2250  # only two whole GPUs
    assert typical_fragment(free, 10_000, 1 << 20, 16384, Request(gpus=1, cpu_milli=20_000)) == 2250  # no CPU
    assert typical_fragment(free, 10_000, 1 << 20, 16384, Request(cpu_milli=1000)) == 2250  # CPU-only: all idle


def test_fgd_scores_the_sigmoid_of_the_fragment_decrease() -> None:
    mix = ((Request(gpu_milli=500), 1), (Request(gpus=1), 1))
    policy = FgdPolicy(ctx(mix))
    n = node(gpus=2, used={0: 600})
    # before: 500-pod sees 400 stranded, 1-GPU pod 400 stranded -> 400; placing 300 on device 0 leaves 100:
    # after 100 (both) -> decrease 300; on device 1 -> 500-pod: 400+... device 1 free 700 -> fits 500, frag = 400
    found = policy.evaluate(n, Request(gpu_milli=300), False, frozenset(), 0)
    assert found is not None
    shares, value = found
    assert shares[0].index == 0
    assert value == int(100 / (1 + math.exp(-300 / 1000)))
