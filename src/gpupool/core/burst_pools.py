"""Burst nodes as the scheduler sees them: each rented node belongs to the department that pays for it. Pure.

A department's ready burst nodes form a pool of their own (`pool_of`), where its quota is what it rents (deserved
and limit both) and every other department's limit is 0: only its work runs on the nodes it pays for, and its
projects, which have no deserved quota there, run there as over-quota (preemptible) work. The simulator and the
live control plane apply the same view (`reserve`), so what the simulator says of bursting holds for the product.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

from gpupool.core.model import MILLI, Node, Queue, Quota, Snapshot


def pool_of(department: str) -> str:
    """The pool of a department's burst nodes."""
    return f"burst-{department}"


def department_quotas(queues: Sequence[Queue], gpus: Mapping[str, int]) -> tuple[Queue, ...]:
    """The organisation's queues with each department's quota in each burst pool: the GPUs it rents there in its
    own (deserved and limit), 0 in every other department's."""
    out = []
    for q in queues:
        if q.parent is None:
            own = {pool_of(d): Quota(limit=0) for d in gpus if d != q.name}
            if q.name in gpus:
                milli = gpus[q.name] * MILLI
                own[pool_of(q.name)] = Quota(milli, limit=milli)
            q = replace(q, quotas={**q.quotas, **own})
        out.append(q)
    return tuple(out)


def reserve(snapshot: Snapshot, owners: Mapping[str, str], closed: Collection[str]) -> Snapshot:
    """The snapshot with every node in `owners` (node name -> department) moved to its department's burst pool,
    and every node in `closed` (drained, given back, or rented and not yet attributed) taking no new work; what
    runs on a node runs on. Unchanged where both are empty."""
    if not owners and not closed:
        return snapshot
    gpus: dict[str, int] = {}
    nodes: list[Node] = []
    for n in snapshot.nodes:
        department = owners.get(n.name)
        if department is not None:
            gpus[department] = gpus.get(department, 0) + len(n.devices)
            n = replace(n, pool=pool_of(department))
        if n.name in closed and n.schedulable:
            n = replace(n, schedulable=False)
        nodes.append(n)
    queues = department_quotas(snapshot.queues, dict(sorted(gpus.items())))
    return replace(snapshot, nodes=tuple(nodes), queues=queues)
