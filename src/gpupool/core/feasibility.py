"""Whether a workload could ever run: every member placed at once on empty nodes, a gang within one pool of one
cluster.

The scheduler asks before it places (work that never fits waits with that reason), and the control plane asks
at submit, to refuse such work before it is stored; both ask here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpupool.core.model import MILLI, Node, Request
from gpupool.core.placement.devices import allowed, could_ever_fit
from gpupool.core.state import DeviceState, NodeState

UNBOUNDED = 1 << 30
"""Members a node could hold where nothing the request asks for runs out."""


def members_on_empty(node: NodeState, req: Request, models: frozenset[str]) -> int:
    """How many members asking `req` an empty copy of `node` could hold at once."""
    if not could_ever_fit(node, req, models):
        return 0
    host = min(
        node.cpu // req.cpu_milli if req.cpu_milli else UNBOUNDED,
        node.memory // req.memory_mib if req.memory_mib else UNBOUNDED,
    )
    devices = [d for d in node.devices if allowed(d, models)]
    if req.gpus:
        return min(host, len(devices) // req.gpus)
    if req.gpu_milli or req.gpu_memory_mib:
        return min(host, sum(_shares_on(d, req) for d in devices))
    return host


def _shares_on(d: DeviceState, req: Request) -> int:
    """Shares of `req` an empty device takes: as many as both its compute and its memory allow."""
    milli, mem = req.share_on(d.memory)
    if milli > MILLI or mem > d.memory:
        return 0
    return min(MILLI // milli, d.memory // mem if mem else UNBOUNDED)


def node_groups(
    nodes: Sequence[NodeState],
    pools: Sequence[str],
    gang: bool,
    models: frozenset[str],
    clusters: Sequence[str] = (),
) -> list[list[NodeState]]:
    """The groups of nodes a workload may be placed within, in order of preference. Where it names clusters,
    each of them in its order, split as below within it; else as below over all of them, except that a gang
    also splits each pool by cluster (by name): a gang never spans two clusters nor two pools. Within a
    cluster (or over all): each pool it names, in its order; else each pool by name, for a gang; else all
    of them. Only nodes with a GPU model it allows, where it names some."""
    usable = [n for n in nodes if not models or n.models & models]
    if clusters:
        named = list(dict.fromkeys(clusters))  # a cluster named twice is still one group of nodes
        wanted = set(named)
        usable = [n for n in usable if n.cluster in wanted]
        found = [g for c in named for g in _by_pool([n for n in usable if n.cluster == c], pools, gang)]
    elif gang and len({n.cluster for n in usable}) > 1:
        found = [
            [n for n in group if n.cluster == c]
            for group in _by_pool(usable, pools, gang)
            for c in sorted({n.cluster for n in group})
        ]
    else:
        found = _by_pool(usable, pools, gang)
    return [g for g in found if g]


def _by_pool(usable: list[NodeState], pools: Sequence[str], gang: bool) -> list[list[NodeState]]:
    if pools:
        return [[n for n in usable if n.pool == p] for p in pools]
    if gang:
        return [[n for n in usable if n.pool == p] for p in sorted({n.pool for n in usable})]
    return [usable]


def ever_fits(groups: Iterable[Iterable[NodeState]], req: Request, gang_size: int, models: frozenset[str]) -> bool:
    """Whether the nodes of one group, all empty, could hold every member at once."""
    for group in groups:
        room = 0
        for n in group:
            room += members_on_empty(n, req, models)
            if room >= gang_size:
                return True
    return False


def states_of(nodes: Iterable[Node]) -> list[NodeState]:
    """Empty working states of nodes, for asking outside a scheduling cycle (pool index unused: 0)."""
    return [NodeState(n, i, 0) for i, n in enumerate(nodes)]
