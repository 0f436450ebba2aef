"""Quota checks: hard limits, and the rule that non-preemptible work stays inside `deserved`."""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.core.decision import PendingCode
from gpupool.core.model import MILLI
from gpupool.core.state import WorkingState


@dataclass(frozen=True, slots=True)
class QuotaVerdict:
    code: PendingCode
    message: str


def check(state: WorkingState, queue: int, pool_idx: int, milli: int, preemptible: bool) -> QuotaVerdict | None:
    """None when `milli` more GPU in this pool keeps the queue and its ancestors within their quotas."""
    pool = state.pools[pool_idx]
    for q in state.tree.chain[queue]:
        quota = state.tree.queues[q].quota(pool)
        used = state.used[q][pool_idx]
        if quota.limit is not None and used + milli > quota.limit:
            name = state.tree.queues[q].name
            return QuotaVerdict(
                PendingCode.OVER_LIMIT,
                f"{name} would exceed its limit of {gpus(quota.limit)} GPUs in pool {pool} "
                f"(using {gpus(used)}, asks {gpus(milli)})",
            )
        if not preemptible and state.np_used[q][pool_idx] + milli > quota.deserved:
            name = state.tree.queues[q].name
            return QuotaVerdict(
                PendingCode.NONPREEMPTIBLE_OVER_DESERVED,
                f"not preemptible, so it must fit in the deserved quota of {name} in pool {pool}: "
                f"{gpus(quota.deserved)} GPUs, of which non-preemptible work uses {gpus(state.np_used[q][pool_idx])}, "
                f"asks {gpus(milli)}",
            )
    return None


def gpus(milli: int) -> str:
    """Milli-GPU as a short GPU count for messages: 4000 -> '4', 250 -> '0.25'."""
    whole, frac = divmod(milli, MILLI)
    if not frac:
        return str(whole)
    return f"{whole}.{frac:03d}".rstrip("0")
