"""Hierarchical fair share by water-filling, per pool, in milli-GPU.

Top down, each queue first gets min(demand, deserved); what its parent has left is shared among the
children with unmet demand in proportion to `over_quota_weight`, never past a child's limit or demand.
"""

from __future__ import annotations

from gpupool.core.state import QueueTree


def fair_shares(tree: QueueTree, pool: str, capacity: int, demand: list[int]) -> list[int]:
    """Fair share of every queue in one pool. `demand` is per queue, already capped at each limit."""
    share = [0] * len(tree.queues)
    _split(tree, pool, tree.roots, capacity, demand, share)
    return share


def capped_demand(tree: QueueTree, pool: str, own: list[int]) -> list[int]:
    """Each queue's demand: its own plus its children's, capped at its limit."""
    out = [0] * len(tree.queues)

    def visit(q: int) -> int:
        total = own[q] + sum(visit(c) for c in tree.children[q])
        limit = tree.queues[q].quota(pool).limit
        out[q] = total if limit is None else min(total, limit)
        return out[q]

    for r in tree.roots:
        visit(r)
    return out


def _split(tree: QueueTree, pool: str, members: list[int], amount: int, demand: list[int], share: list[int]) -> None:
    if not members:
        return
    deserved = [tree.queues[c].quota(pool).deserved for c in members]
    give = [min(demand[c], d) for c, d in zip(members, deserved, strict=True)]
    if sum(give) > amount:
        give = _proportional(amount, give)
    left = amount - sum(give)
    caps = [demand[c] for c in members]
    weights = [max(0, tree.queues[c].quota(pool).over_quota_weight) for c in members]
    _water_fill(left, give, caps, weights)
    for c, g in zip(members, give, strict=True):
        share[c] = g
        _split(tree, pool, tree.children[c], g, demand, share)


def _proportional(amount: int, wants: list[int]) -> list[int]:
    """Scale `wants` down to sum to `amount`, largest remainders first (ties by position)."""
    total = sum(wants)
    base = [amount * w // total for w in wants]
    rest = amount - sum(base)
    order = sorted(range(len(wants)), key=lambda i: (-(amount * wants[i] % total), i))
    for i in order[:rest]:
        base[i] += 1
    return base


def _water_fill(left: int, give: list[int], caps: list[int], weights: list[int]) -> None:
    while left > 0:
        active = [i for i in range(len(give)) if give[i] < caps[i] and weights[i] > 0]
        if not active:
            return
        total_w = sum(weights[i] for i in active)
        handed = 0
        capped = False
        for i in active:
            inc = left * weights[i] // total_w
            if inc >= caps[i] - give[i]:
                inc, capped = caps[i] - give[i], True
            give[i] += inc
            handed += inc
        if not capped:
            # Nobody hit a cap: the milli that flooring left over go by largest remainder, ties by position.
            rest = left - handed
            order = sorted(active, key=lambda i: (-(left * weights[i] % total_w), i))
            for i in order[:rest]:
                give[i] += 1
            handed += min(rest, len(order))
        left -= handed
