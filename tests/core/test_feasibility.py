"""Whether a workload could ever run: members an empty node holds, and a gang kept within one pool."""

from __future__ import annotations

import pytest

from gpupool.core import Device, Node, Request
from gpupool.core.feasibility import ever_fits, members_on_empty, node_groups, states_of
from tests.core.builders import Cluster, Run

GIB = 1024
ANY: frozenset[str] = frozenset()


def node(name: str, pool: str = "p0", gpus: int = 2, gib: int = 80, model: str = "H100", cpus: int = 16) -> Node:
    return Node(name, pool, cpus * 1000, 256 * GIB, tuple(Device(d, model, gib * GIB) for d in range(gpus)))


@pytest.mark.parametrize(
    ("request_", "members"),
    [
        (Request(gpus=1), 2),
        (Request(gpus=3), 0),
        (Request(gpu_milli=300), 6),  # three a device: a share never spans devices
        (Request(gpu_milli=300, cpu_milli=4000), 4),  # the node's 16 CPUs run out first
        (Request(gpu_memory_mib=30 * GIB), 4),  # two 30 GiB shares of each 80 GiB device
        (Request(gpu_memory_mib=81 * GIB), 0),
        (Request(cpu_milli=5000), 3),
        (Request(memory_mib=300 * GIB), 0),
    ],
)
def test_members_an_empty_node_holds(request_: Request, members: int) -> None:
    [state] = states_of([node("n0")])
    assert members_on_empty(state, request_, ANY) == members


def test_only_devices_of_an_allowed_model_count() -> None:
    mixed = Node("n0", "p0", 16_000, 256 * GIB, (Device(0, "A100", 40 * GIB), Device(1, "H100", 80 * GIB)))
    [state] = states_of([mixed])
    assert members_on_empty(state, Request(gpu_milli=500), frozenset({"H100"})) == 2
    assert members_on_empty(state, Request(gpus=2), frozenset({"H100"})) == 0


def test_fractional_gang_counts_the_shares_the_devices_hold() -> None:
    groups = node_groups(states_of([node("n0", gpus=1)]), (), True, ANY)
    assert ever_fits(groups, Request(gpu_milli=500), 2, ANY)
    assert not ever_fits(groups, Request(gpu_milli=500), 3, ANY)


def test_a_gang_never_spans_two_pools_but_single_members_may_go_anywhere() -> None:
    states = states_of([node("a0", "a"), node("b0", "b")])
    assert not ever_fits(node_groups(states, (), True, ANY), Request(gpus=1), 3, ANY)
    assert [[n.name for n in g] for g in node_groups(states, (), True, ANY)] == [["a0"], ["b0"]]
    assert [[n.name for n in g] for g in node_groups(states, (), False, ANY)] == [["a0", "b0"]]
    assert [[n.name for n in g] for g in node_groups(states, ("b", "a"), False, ANY)] == [["b0"], ["a0"]]
    assert ever_fits(node_groups(states, ("b",), True, ANY), Request(gpus=1), 2, ANY)


def test_nodes_without_an_allowed_model_form_no_group() -> None:
    states = states_of([node("a0", "a", model="A100"), node("b0", "b")])
    assert [[n.name for n in g] for g in node_groups(states, (), True, frozenset({"H100"}))] == [["b0"]]
    assert node_groups(states, ("a",), False, frozenset({"H100"})) == []


def test_a_gang_of_shares_more_than_the_pool_could_ever_hold_never_fits() -> None:
    # Three half-GPU members on the only, one-GPU node: two fit on its device, the third never can. The scheduler
    # asks the same predicate as submit, so it says so instead of waiting for room that cannot come.
    c = Cluster().pool("p", nodes=1, gpus=1).project("a", pool="p", deserved=1)
    c.submit("gang", "a", gpu=0.5, workers=3)
    run = Run(c.snapshot()).settle()
    assert (run.pending(), run.reason("gang")) == ({"gang"}, "never-fits")
