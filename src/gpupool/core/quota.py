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


def check(
    state: WorkingState, queue: int, pool_idx: int, milli: int, preemptible: bool, cpu: int = 0, memory: int = 0
) -> QuotaVerdict | None:
    """None when `milli` more GPU (and `cpu`, `memory`) in this pool keeps the queue and its ancestors within
    their quotas: every limit, and for non-preemptible work every deserved quota."""
    pool = state.pools[pool_idx]
    for q in state.tree.chain[queue]:
        quota = state.tree.queues[q].quota(pool)
        name = state.tree.queues[q].name
        used = state.used[q][pool_idx]
        if quota.limit is not None and used + milli > quota.limit:
            return QuotaVerdict(
                PendingCode.OVER_LIMIT,
                f"{name} would exceed its limit of {gpu_count(quota.limit)} in pool {pool} "
                f"(using {gpus(used)}, asks {gpus(milli)})",
            )
        if not preemptible and state.np_used[q][pool_idx] + milli > quota.deserved:
            return QuotaVerdict(
                PendingCode.NONPREEMPTIBLE_OVER_DESERVED,
                f"not preemptible, so it must fit in the deserved quota of {name} in pool {pool}: "
                f"{gpu_count(quota.deserved)}, of which non-preemptible work uses {gpus(state.np_used[q][pool_idx])}, "
                f"asks {gpus(milli)}",
            )
        host = state.host_used[q][pool_idx]
        for what, asked, have, np_have, limit, deserved, unit in (
            ("CPU", cpu, host[0], host[2], quota.cpu_limit, quota.cpu_deserved, "millicores"),
            ("memory", memory, host[1], host[3], quota.memory_limit, quota.memory_deserved, "MiB"),
        ):
            if limit is not None and have + asked > limit:
                return QuotaVerdict(
                    PendingCode.OVER_LIMIT,
                    f"{name} would exceed its {what} limit of {limit} {unit} in pool {pool} "
                    f"(using {have}, asks {asked})",
                )
            if not preemptible and deserved is not None and np_have + asked > deserved:
                return QuotaVerdict(
                    PendingCode.NONPREEMPTIBLE_OVER_DESERVED,
                    f"not preemptible, so it must fit in the {what} deserved quota of {name} in pool {pool}: "
                    f"{deserved} {unit}, of which non-preemptible work uses {np_have}, asks {asked}",
                )
    return None


def gpus(milli: int) -> str:
    """Milli-GPU as a short GPU count for messages: 4000 -> '4', 250 -> '0.25'."""
    whole, frac = divmod(milli, MILLI)
    if not frac:
        return str(whole)
    return f"{whole}.{frac:03d}".rstrip("0")


def gpu_count(milli: int) -> str:
    """Milli-GPU with its noun, as the rest of gpupool writes a request: 1000 -> '1 GPU', 500 -> '0.5 GPU' (a
    part of one is singular too), 2000 -> '2 GPUs', 0 -> '0 GPUs'."""
    return f"{gpus(milli)} {'GPU' if 0 < milli <= MILLI else 'GPUs'}"
