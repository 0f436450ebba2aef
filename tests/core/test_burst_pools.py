"""Burst nodes as the scheduler sees them (`core/burst_pools.py`): only the department that pays runs there."""

from __future__ import annotations

from gpupool.core import SchedulerConfig, schedule
from gpupool.core.burst_pools import pool_of, reserve
from gpupool.core.model import MILLI, Quota
from tests.core.builders import Cluster


def _cloud() -> Cluster:
    """One on-premises node, busy, and three 1-GPU burst nodes in a cluster of their own."""
    c = Cluster().pool("h100", gpus=1).pool("cloud", nodes=3, gpus=1, cluster="cloud")
    c.department("research").project("vision", "research").department("ops").project("serve", "ops")
    return c.running("busy", "serve", "h100-0", [0])


def test_each_burst_node_takes_only_its_department_s_work() -> None:
    c = _cloud()
    c.submit("ops-job", "serve", gpus=1).submit("research-job", "vision", gpus=1)
    snapshot = reserve(c.snapshot(), {"cloud-cloud-0": "research"}, {"cloud-cloud-1", "cloud-cloud-2"})
    binds = {b.workload: [p.node for p in b.placements] for b in schedule(snapshot, SchedulerConfig()).binds}
    # The rented node is research's; ops' work waits though it came first, and no work lands on a closed node.
    assert binds == {"research-job": ["cloud-cloud-0"]}
    pools = {n.name: (n.pool, n.schedulable) for n in snapshot.nodes}
    assert pools == {
        "h100-0": ("h100", True),
        "cloud-cloud-0": ("burst-research", True),
        "cloud-cloud-1": ("cloud", False),
        "cloud-cloud-2": ("cloud", False),
    }
    quotas = {q.name: q.quotas.get(pool_of("research")) for q in snapshot.queues}
    assert quotas == {
        "research": Quota(MILLI, limit=MILLI),
        "ops": Quota(limit=0),
        "vision": None,
        "serve": None,
    }


def test_nothing_changes_without_burst_nodes() -> None:
    snapshot = _cloud().snapshot()
    assert reserve(snapshot, {}, set()) is snapshot
