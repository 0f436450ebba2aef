"""Pools and GPU models: constraints, preference order, and quotas per pool."""

from tests.core.builders import Cluster, Run


def cluster() -> Cluster:
    return Cluster().pool("h100", nodes=1, gpus=4, model="H100").pool("a100", nodes=1, gpus=4, model="A100")


def test_workload_lands_only_in_an_allowed_pool() -> None:
    c = cluster().project("a", deserved=4)
    c.submit("w", "a", gpus=2, pools=["a100"])
    run = Run(c.snapshot()).settle()
    assert run.workload("w").placements[0].node.startswith("a100")


def test_pools_are_tried_in_order_of_preference() -> None:
    c = cluster().project("a", deserved=4)
    c.submit("fill", "a", gpus=4, pools=["h100"]).submit("w", "a", gpus=2, pools=["h100", "a100"])
    run = Run(c.snapshot()).settle()
    assert run.workload("w").placements[0].node.startswith("a100")


def test_gpu_model_constraint() -> None:
    c = cluster().project("a", deserved=4)
    c.submit("w", "a", gpus=1, models=["H100"])
    run = Run(c.snapshot()).settle()
    assert run.workload("w").placements[0].node.startswith("h100")


def test_no_node_in_the_allowed_pools_explains_itself() -> None:
    c = cluster().project("a", deserved=8)
    c.submit("fill", "a", gpus=4, pools=["a100"]).submit("w", "a", gpus=2, pools=["a100"])
    run = Run(c.snapshot()).settle()
    p = run.decisions[-1].pending_for("w")
    assert p is not None and p.code.value == "no-node-fits"
    assert "pool a100" in p.message and "2 free GPUs" in p.message


def test_quota_is_per_pool() -> None:
    c = cluster().project("a", deserved=0, limit=2, pool="h100")
    c.submit("w1", "a", gpus=2, pools=["h100", "a100"]).submit("w2", "a", gpus=2, pools=["h100", "a100"])
    run = Run(c.snapshot()).settle()
    # the h100 limit sends the second to its next choice, where the project has no cap
    assert run.workload("w1").placements[0].node.startswith("h100")
    assert run.workload("w2").placements[0].node.startswith("a100")
