"""Telemetry written down: each running workload's utilisation, idle clock, peaks (for right-sizing advice), and
its usage per minute."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.backends.base import Sample
from gpupool.control.policies import Policy
from gpupool.lifecycle.phases import LIVE, STARTED
from gpupool.lifecycle.transitions import current
from gpupool.store.tables import NodeRow, UsageRow, WorkloadRow


def account(
    session: Session,
    rows: Sequence[WorkloadRow],
    sample: Sample,
    policies: Mapping[int, Policy],
    nodes: Mapping[str, NodeRow],
    since: float,
    now: float,
    *,
    burst_prices: Mapping[str, int] | None = None,
) -> None:
    """Charge the interval [since, now) to every running workload: allocated milli-GPU-seconds, and the busy
    part by its sampled utilisation; start or clear its idle clock. `burst_prices`: the rented (burst) nodes, by
    name, and their price in micro-dollars per GPU-hour: a workload there is charged at that price, as its first
    member's node says (a minute's row keeps the price it was written with)."""
    dt = max(0.0, now - since)
    minute = int(now // 60)
    charged = {u.workload_id: u for u in usage_rows(session, [r.id for r in rows if r.state in LIVE], minute)}
    for row in rows:
        if row.state not in LIVE:
            continue
        allocs = [a for a in current(row) if a.state in STARTED]
        milli = sum(int(d["milli"]) for a in allocs for d in a.devices)
        if not allocs or milli == 0:
            continue
        weighted = 0.0
        memory = 0
        largest = 0
        for a in allocs:
            seen = sample.members.get(a.id)
            share = sum(int(d["milli"]) for d in a.devices)
            if seen is not None:
                weighted += seen.util_pct * share
                memory += seen.memory_used_mib
                largest = max(largest, seen.memory_used_mib)
        util = round(weighted / milli)
        idle_since = (row.idle_since or since) if util < policies[row.project_id].idle_threshold_pct else None
        if (row.gpu_util_pct, row.gpu_memory_used_mib, row.idle_since) != (util, memory, idle_since):
            # Only rows that changed are written (and stamped): most keep their figures from one sample to the next.
            row.gpu_util_pct, row.gpu_memory_used_mib, row.idle_since = util, memory, idle_since
        # Peaks for right-sizing: they change only when a sample beats them, so they seldom add a write.
        peaks = (max(row.gpu_memory_peak_mib or 0, largest), max(row.gpu_util_peak_pct or 0, util))
        if (row.gpu_memory_peak_mib, row.gpu_util_peak_pct) != peaks:
            row.gpu_memory_peak_mib, row.gpu_util_peak_pct = peaks
        if dt == 0:
            continue
        node = nodes.get(allocs[0].node)
        usage = charged.get(row.id)
        if usage is None:
            usage = UsageRow(
                workload_id=row.id, minute=minute, pool=node.pool if node else "", milli_seconds=0.0,
                busy_milli_seconds=0.0, burst_price_micro=(burst_prices or {}).get(allocs[0].node),
            )  # fmt: skip
            session.add(usage)
        usage.milli_seconds += milli * dt
        if usage.gpu_memory_mib is None or memory > usage.gpu_memory_mib:
            usage.gpu_memory_mib = memory
        usage.busy_milli_seconds += milli * dt * util / 100


def usage_rows(session: Session, workload_ids: Sequence[int], minute: int) -> list[UsageRow]:
    """The minute's usage rows of these workloads, in a few queries (not one per workload)."""
    out: list[UsageRow] = []
    for at in range(0, len(workload_ids), 500):
        chunk = workload_ids[at : at + 500]
        out.extend(session.scalars(select(UsageRow).where(UsageRow.minute == minute, UsageRow.workload_id.in_(chunk))))
    return out
