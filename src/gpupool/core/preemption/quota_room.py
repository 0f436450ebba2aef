"""Room under a limit: which of a project's own running workloads a waiting workload of it evicts to pass the
limits of its project and departments, as KAI-Scheduler and Kueue do (a project at its limit otherwise waits
for ever while its own lower-priority work runs on).

Quota is not tied to a node, so the victims come from the whole pool: lowest priority first, then the most
recently started (the rule of `victim_sets` without the node), taken until what they free covers what the
limits ask, then any the others cover put back (last taken first). Capacity is the placement's business
afterwards: the victims' GPUs are released for it, and the usual victim search frees more where needed.
A deserved quota that non-preemptible work must fit in is no bar evictions lift: only non-preemptible work
counts against it, and that is never a victim.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gpupool.core.decision import Eviction, EvictReason
from gpupool.core.model import State
from gpupool.core.state import WorkingState, WorkloadState

Need = tuple[int, int, int]
"""GPU milli, CPU millicores and memory MiB."""
Key = Callable[[WorkloadState], tuple[int, float, str]]


def need(state: WorkingState, ws: WorkloadState, p: int) -> Need | None:
    """What must leave pool `p` for `ws` to pass every limit of its project and departments there: (0, 0, 0)
    when it passes; None where a non-preemptible workload is over a deserved quota (evictions cannot help)."""
    w, pool = ws.w, state.pools[p]
    asks = (
        w.request.nominal_milli() * w.gang_size,
        w.request.cpu_milli * w.gang_size,
        w.request.memory_mib * w.gang_size,
    )
    out = [0, 0, 0]
    for q in state.tree.chain[ws.queue]:
        quota, host = state.tree.queues[q].quota(pool), state.host_used[q][p]
        used = (state.used[q][p], host[0], host[1])
        if not w.preemptible:
            np_used = (state.np_used[q][p], host[2], host[3])
            deserved = (quota.deserved, quota.cpu_deserved, quota.memory_deserved)
            if any(d is not None and n + a > d for n, a, d in zip(np_used, asks, deserved, strict=True)):
                return None
        for r, limit in enumerate((quota.limit, quota.cpu_limit, quota.memory_limit)):
            if limit is not None:
                out[r] = max(out[r], used[r] + asks[r] - limit)
    return out[0], out[1], out[2]


def frees(v: WorkloadState) -> Need:
    members = len(v.placements)
    return v.milli, v.w.request.cpu_milli * members, v.w.request.memory_mib * members


def choose(candidates: Iterable[WorkloadState], short: Need, key: Key) -> list[WorkloadState]:
    """The victims, in `key` order, whose leaving covers `short`; empty if all of them do not."""
    chosen: list[WorkloadState] = []
    left = list(short)
    for v in sorted(candidates, key=key):
        if all(x <= 0 for x in left):
            break
        f = frees(v)
        if not any(f[r] and left[r] > 0 for r in range(3)):
            continue
        chosen.append(v)
        left = [left[r] - f[r] for r in range(3)]
    if any(x > 0 for x in left):
        return []
    for v in reversed(list(chosen)):  # put back any the others cover
        f = frees(v)
        if all(left[r] + f[r] <= 0 for r in range(3) if short[r] > 0):
            chosen.remove(v)
            left = [left[r] + f[r] for r in range(3)]
    return chosen


def make_room(
    state: WorkingState,
    ws: WorkloadState,
    p: int,
    own: Iterable[WorkloadState],
    eligible: Callable[[WorkloadState], bool],
    key: Key,
    message: str,
) -> bool:
    """Evict the cheapest of `own` (its project's work) that brings `ws` under its limits in pool `p`; False
    (nothing evicted) when no set of them does."""
    short = need(state, ws, p)
    if short is None:
        return False
    if all(x <= 0 for x in short):
        return True
    candidates = [v for v in own if v.state is State.RUNNING and not v.bound and v.pool_idx == p and eligible(v)]
    chosen = choose(candidates, short, key)
    for v in chosen:
        state.evict(v, Eviction(v.w.id, EvictReason.PREEMPT, message, preemptor=ws.w.id))
    return bool(chosen)
