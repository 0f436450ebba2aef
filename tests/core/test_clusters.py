"""Clusters: a topology level above nodes. A hub schedules the nodes of several clusters in one snapshot; a gang
never spans two, and a workload naming clusters runs only there, in its order of preference."""

import dataclasses

from gpupool.core import Device, Node, SchedulerConfig, Snapshot
from gpupool.core.feasibility import node_groups, states_of
from tests.core.builders import Cluster, Run


def _nodes(run: Run, wid: str) -> list[str]:
    return sorted({p.node for p in run.workload(wid).placements})


def _relabel(snapshot: Snapshot, cluster: str) -> Snapshot:
    """The same snapshot with every node in `cluster`."""
    nodes = tuple(dataclasses.replace(n, cluster=cluster) for n in snapshot.nodes)
    return dataclasses.replace(snapshot, nodes=nodes)


def two_halves(extra_west: int = 0) -> Cluster:
    """Two clusters of two 4-GPU nodes each; production work of project b fills the second node of each."""
    c = Cluster()
    for name in ("east", "west"):
        c.pool("h100", nodes=2, gpus=4, cluster=name)
    if extra_west:
        c.pool("h100", nodes=extra_west, gpus=4, cluster="west")
    # a may use every GPU within its deserved quota: what holds a gang back is capacity, never quota
    c.project("a", deserved=16, pool="h100").project("b", deserved=8, pool="h100")
    c.running("prod-east", "b", "east-h100-1", range(4), gpus=4, priority="production")
    c.running("prod-west", "b", "west-h100-1", range(4), gpus=4, priority="production")
    return c


def test_gang_never_spans_two_clusters() -> None:
    c = two_halves().submit("ddp", "a", gpus=4, workers=2)
    run = Run(c.snapshot()).settle()
    assert run.workload("ddp").placements == ()
    assert run.evicted() == []
    p = run.decisions[-1].pending_for("ddp")
    assert p is not None and p.code.value == "gang-unplaceable"
    assert p.message == "gang of 2 members, each needing 4 free GPUs, cannot be placed whole in any pool"


def test_gang_goes_whole_to_the_cluster_with_room_for_it() -> None:
    c = two_halves(extra_west=1).submit("ddp", "a", gpus=4, workers=2)
    run = Run(c.snapshot()).settle()
    assert _nodes(run, "ddp") == ["west-h100-0", "west-h100-2"]


def test_the_same_gang_spans_both_halves_of_one_cluster() -> None:
    """The contrast: with every node in one cluster, the two free nodes take the gang."""
    c = two_halves().submit("ddp", "a", gpus=4, workers=2)
    run = Run(_relabel(c.snapshot(), "")).settle()
    assert _nodes(run, "ddp") == ["east-h100-0", "west-h100-0"]


def roomy_east() -> Cluster:
    """East: two empty 8-GPU nodes. West: one 8-GPU node, half of it held by production work of project b."""
    c = Cluster().pool("h100", nodes=2, gpus=8, cluster="east").pool("h100", nodes=1, gpus=8, cluster="west")
    c.project("a", deserved=16, pool="h100").project("b", deserved=8, pool="h100")
    return c.running("prod", "b", "west-h100-0", range(4), gpus=4, priority="production")


def test_workload_naming_a_cluster_runs_only_there() -> None:
    c = roomy_east().submit("w", "a", gpus=2, clusters=["west"])
    run = Run(c.snapshot()).settle()
    assert _nodes(run, "w") == ["west-h100-0"]


def test_workload_naming_a_full_cluster_waits_and_says_where() -> None:
    c = roomy_east().running("fill", "b", "west-h100-0", range(4, 8), gpus=4, priority="production")
    c.submit("w", "a", gpus=2, clusters=["west"])
    run = Run(c.snapshot()).settle()
    assert run.workload("w").placements == ()
    p = run.decisions[-1].pending_for("w")
    assert p is not None and p.code.value == "no-node-fits"
    assert p.message == "no node in any pool in cluster west has 2 free GPUs"


def test_message_names_pools_and_several_clusters() -> None:
    c = roomy_east().submit("w", "a", gpus=9, pools=["h100"], clusters=["west", "east"])
    run = Run(c.snapshot()).settle()
    p = run.decisions[-1].pending_for("w")
    assert p is not None and p.code.value == "never-fits"
    assert p.message == "no node in pool h100 in clusters west, east could host 9 free GPUs, even empty"


def test_clusters_are_tried_in_order_of_preference() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=8, cluster="east").pool("h100", nodes=1, gpus=8, cluster="west")
    c.project("a", deserved=16, pool="h100")
    c.submit("w", "a", gpus=2, clusters=["west", "east"]).submit("g", "a", gpus=2, workers=2, clusters=["west", "east"])
    run = Run(c.snapshot()).settle()
    assert (_nodes(run, "w"), _nodes(run, "g")) == (["west-h100-0"], ["west-h100-0"])


def test_unschedulable_cluster_takes_nothing() -> None:
    c = Cluster().pool("h100", nodes=2, gpus=8, cluster="east", schedulable=False)
    c.pool("h100", nodes=2, gpus=8, cluster="west").project("a", deserved=16, pool="h100")
    c.submit("ddp", "a", gpus=4, workers=2)
    for i in range(3):
        c.submit(f"s{i}", "a", gpus=2)
    run = Run(c.snapshot()).settle()
    assert run.running() == {"ddp", "s0", "s1", "s2"}
    assert {node for wid in run.running() for node in _nodes(run, wid)} == {"west-h100-0", "west-h100-1"}


def batch_in_both() -> Cluster:
    """Two clusters of two 4-GPU nodes: production work of b on the second of each, batch work of a on the
    first of each."""
    c = two_halves()
    c.running("batch-east", "a", "east-h100-0", range(4), gpus=4, priority="batch")
    return c.running("batch-west", "a", "west-h100-0", range(4), gpus=4, priority="batch")


def test_gang_evicts_nobody_where_only_victims_in_two_clusters_would_make_room() -> None:
    c = batch_in_both().submit("ddp", "a", gpus=4, workers=2)
    run = Run(c.snapshot()).settle()
    assert run.evicted() == []
    assert run.running() == {"prod-east", "prod-west", "batch-east", "batch-west"}
    assert run.reason("ddp") == "gang-unplaceable"


def test_in_one_cluster_the_same_gang_evicts_both() -> None:
    """The contrast: with every node in one cluster, evicting both batch workloads makes room for the gang."""
    c = batch_in_both().submit("ddp", "a", gpus=4, workers=2)
    run = Run(_relabel(c.snapshot(), "")).settle()
    assert sorted(run.evicted()) == ["batch-east", "batch-west"]
    assert _nodes(run, "ddp") == ["east-h100-0", "west-h100-0"]


def test_preemption_stays_in_the_named_cluster() -> None:
    """batch-west, started last, is the cheaper victim; only batch-east is in the cluster the workload names."""
    c = batch_in_both().submit("w", "a", gpus=4, clusters=["east"])
    run = Run(c.snapshot()).settle()
    assert run.evicted() == ["batch-east"]
    assert _nodes(run, "w") == ["east-h100-0"]


def test_workloads_alike_but_for_their_clusters_are_tried_apart() -> None:
    """What one try found (no room in west) says nothing of a workload asking the same in east."""
    c = roomy_east().running("fill", "b", "west-h100-0", range(4, 8), gpus=4, priority="production")
    c.submit("w-west", "a", gpus=2, clusters=["west"]).submit("w-east", "a", gpus=2, clusters=["east"])
    d = Run(c.snapshot()).cycle()
    assert [b.workload for b in d.binds] == ["w-east"]


def borrowed_in_both() -> Cluster:
    """Two clusters of two 4-GPU nodes, all held by project b beyond its deserved quota: batch work on the first
    node of each, training on the second. Project a is owed 8 GPUs and asks for them as a gang."""
    c = Cluster().pool("h100", nodes=2, gpus=4, cluster="east").pool("h100", nodes=2, gpus=4, cluster="west")
    c.project("a", deserved=8, pool="h100").project("b", deserved=0, pool="h100")
    for name in ("east", "west"):
        c.running(f"b-{name}-batch", "b", f"{name}-h100-0", range(4), gpus=4, priority="batch")
        c.running(f"b-{name}-train", "b", f"{name}-h100-1", range(4), gpus=4, priority="training")
    return c.submit("ddp", "a", gpus=4, workers=2)


def test_reclaim_for_a_gang_takes_victims_in_one_cluster() -> None:
    d = Run(borrowed_in_both().snapshot()).cycle()
    assert [e.workload for e in d.evictions] == ["b-east-batch", "b-east-train"]
    p = d.pending_for("ddp")
    assert p is not None and sorted(x.node for x in p.nominated) == ["east-h100-0", "east-h100-1"]


def test_in_one_cluster_reclaim_takes_the_cheapest_victims_anywhere() -> None:
    """The contrast: with every node in one cluster, the two batch workloads are the cheapest set."""
    d = Run(_relabel(borrowed_in_both().snapshot(), "")).cycle()
    assert [e.workload for e in d.evictions] == ["b-east-batch", "b-west-batch"]


def test_reclaim_takes_victims_only_in_the_named_cluster() -> None:
    """b-west, started last, is the cheaper victim; only b-east is in the cluster the workload names."""
    c = Cluster().pool("h100", nodes=1, gpus=8, cluster="east").pool("h100", nodes=1, gpus=8, cluster="west")
    c.project("a", deserved=8, pool="h100").project("b", deserved=0, pool="h100")
    c.running("b-east", "b", "east-h100-0", range(8), gpus=8, priority="batch")
    c.running("b-west", "b", "west-h100-0", range(8), gpus=8, priority="batch")
    c.submit("w", "a", gpus=4, clusters=["east"])
    run = Run(c.snapshot()).settle()
    assert run.evicted() == ["b-east"]
    assert _nodes(run, "w") == ["east-h100-0"]


def owed_a_node(b_clusters: tuple[str, ...]) -> Cluster:
    """Project a is owed a whole 4-GPU node, but one GPU of b (within its quota: not reclaimable) sits on each
    node of east beside work c borrows; west has one GPU free. One of b's workloads must move."""
    c = Cluster().pool("h100", nodes=2, gpus=4, cluster="east").pool("h100", nodes=1, gpus=4, cluster="west")
    for name, deserved in (("a", 4), ("b", 2), ("c", 2), ("x", 3)):
        c.project(name, deserved=deserved, pool="h100")
    c.running("b0", "b", "east-h100-0", [0], gpus=1, clusters=b_clusters)
    c.running("b1", "b", "east-h100-1", [0], gpus=1, clusters=b_clusters)
    for i in range(6):
        c.running(f"c{i}", "c", f"east-h100-{i // 3}", [i % 3 + 1], gpus=1)
    c.running("x0", "x", "west-h100-0", [0, 1, 2], gpus=3, priority="production")
    return c.submit("a0", "a", gpus=4)


def test_a_moved_workload_goes_only_to_a_cluster_it_accepts() -> None:
    """b1 may not take west's free GPU: it moves within east, where one more of c's borrowed GPUs makes room."""
    d = Run(owed_a_node(("east",)).snapshot()).cycle()
    assert [(e.workload, e.reason.value) for e in d.evictions] == [
        ("b1", "consolidate"), ("c2", "reclaim"), ("c3", "reclaim"), ("c4", "reclaim"), ("c5", "reclaim"),
    ]  # fmt: skip
    p = d.pending_for("b1")
    assert p is not None and [x.node for x in p.nominated] == ["east-h100-0"]


def test_a_moved_workload_naming_no_cluster_takes_the_free_gpu_anywhere() -> None:
    d = Run(owed_a_node(()).snapshot()).cycle()
    p = d.pending_for("b1")
    assert p is not None and [x.node for x in p.nominated] == ["west-h100-0"]


def busy_single_cluster() -> Cluster:
    """One cluster with two pools, fractions, gangs, preemption and reclaim to decide."""
    c = Cluster().pool("h100", nodes=3, gpus=8).pool("a100", nodes=2, gpus=4, model="A100")
    c.project("a", deserved=12).project("b", deserved=8)
    c.running("a-batch", "a", "h100-0", range(8), gpus=8, priority="batch")
    c.running("b-over", "b", "h100-1", range(8), gpus=8, priority="batch")
    c.running("b-frac", "b", "a100-0", [0], gpu=0.5)
    c.submit("a-gang", "a", gpus=4, workers=3).submit("a-frac", "a", gpu=0.25, workers=2)
    c.submit("b-one", "b", gpus=2, pools=["a100", "h100"]).submit("a-pin", "a", gpus=1, models=["A100"])
    return c.submit("b-big", "b", gpus=8, workers=2)


def test_naming_the_only_cluster_changes_no_decision() -> None:
    snapshot = busy_single_cluster().snapshot()
    config = SchedulerConfig()
    plain, named = Run(snapshot, config), Run(_relabel(snapshot, "a"), config)
    for _ in range(4):
        assert plain.cycle().to_dict() == named.cycle().to_dict()
    assert plain.decisions[0].evictions  # the snapshot gives preemption and reclaim something to decide


def test_gang_groups_are_per_pool_then_per_cluster() -> None:
    nodes = [
        Node(f"{cluster}-{pool}", pool, 1000, 1024, (Device(0, "H100", 1024),), cluster=cluster)
        for cluster in ("west", "east")
        for pool in ("b", "a")
    ]
    groups = node_groups(states_of(nodes), ["b", "a"], True, frozenset(), ())
    assert [[n.name for n in g] for g in groups] == [["east-b"], ["west-b"], ["east-a"], ["west-a"]]
    groups = node_groups(states_of(nodes), [], True, frozenset(), ())
    assert [[n.name for n in g] for g in groups] == [["east-a"], ["west-a"], ["east-b"], ["west-b"]]
    groups = node_groups(states_of(nodes), [], False, frozenset(), ["west", "east"])
    assert [[n.name for n in g] for g in groups] == [["west-b", "west-a"], ["east-b", "east-a"]]
