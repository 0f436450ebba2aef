"""What the backend observed, written back: members that ended, workloads that finished, failed or were stopped."""

from __future__ import annotations

from collections.abc import Sequence

from gpupool.backends.base import Observed
from gpupool.store.tables import AllocationRow, EventRow, WorkloadRow

EVICTIONS = ("reclaim", "preempt", "consolidate", "gang-broken", "node-lost")
POLICY_STOPS = ("idle", "max-runtime")


def record(row: WorkloadRow, state: str, reason: str, now: float) -> EventRow:
    row.state, row.reason = state, reason
    return EventRow(workload_id=row.id, at=now, state=state, reason=reason)


def current(row: WorkloadRow) -> list[AllocationRow]:
    return [a for a in row.allocations if a.attempt == row.attempt]


def reconcile(
    rows: Sequence[WorkloadRow], observed: dict[str, Observed] | None, now: float
) -> tuple[list[EventRow], list[str]]:
    """Returns the events, and the launches that ended: the caller tells the backend to forget them once this
    is committed, so a crash in between never loses how a member ended. An unsynced view (None) is "unknown":
    no member is concluded gone from it."""
    events: list[EventRow] = []
    ended_now: list[str] = []
    if observed is None:
        return events, ended_now
    for row in rows:
        if row.state not in ("starting", "running"):
            continue
        allocs = current(row)
        for alloc in allocs:
            if alloc.state in ("bound", "ended"):
                continue
            seen = observed.get(alloc.id)
            if seen is not None and seen.alive:
                alloc.enforced = seen.enforced
                continue
            alloc.state = "ended"
            alloc.exit_code = seen.exit_code if seen is not None else None
            if seen is not None and seen.lost and row.stop_reason is None:
                # Its node went away: not the workload's doing, so it goes back in the queue.
                row.stop_reason = "node-lost"
                row.reason = f"node {alloc.node} was lost"
                for other in allocs:
                    if other.state != "ended" and other.stop_at is None:
                        other.stop_at = now
            ended_now.append(alloc.id)
        ended = [a for a in allocs if a.state == "ended"]
        if not ended:
            continue
        if len(ended) == len(allocs):
            events.append(_finish(row, allocs, now))
            continue
        bad = [a for a in ended if a.exit_code != 0]
        if bad and row.stop_reason is None:
            # One member failed: the rest of the gang cannot go on without it.
            row.stop_reason = "failed"
            for a in allocs:
                if a.state != "ended" and a.stop_at is None:
                    a.stop_at = now
            code = bad[0].exit_code
            events.append(record(row, row.state, f"member {bad[0].member} exited with {_code(code)}; stopping", now))
    return events, ended_now


def _code(code: int | None) -> str:
    return "an unknown status (killed or lost)" if code is None else f"code {code}"


def _finish(row: WorkloadRow, allocs: list[AllocationRow], now: float) -> EventRow:
    reason = row.stop_reason
    row.stop_reason = None
    if reason != "consolidate":  # a moved workload restarts where it was nominated when it was moved
        row.nominated = []
    row.idle_since = None
    if reason in POLICY_STOPS:
        why = row.reason.removesuffix("; stopping")
        if row.type == "notebook":
            # Suspended, not requeued: its files stay; `gpupool resume` brings it back.
            row.attempt += 1
            row.started_at = None
            row.hold = True
            return record(row, "suspended", f"{why}; resume it to start again", now)
        row.finished_at = now
        return record(row, "failed", f"stopped by policy: {why}", now)
    if reason == "cancel":
        row.finished_at = now
        return record(row, "cancelled", row.reason.removesuffix("; stopping"), now)
    if reason in EVICTIONS:
        # Requeued in its old place: preemptible training and batch as preempted, notebooks as suspended
        # (their files stay in the working directory for the next start).
        why = row.reason.removesuffix("; stopping")
        row.attempt += 1
        row.started_at = None
        row.reason_code = None
        return record(row, "suspended" if row.type == "notebook" else "preempted", f"requeued after {why}", now)
    row.finished_at = now
    bad = [a for a in allocs if a.exit_code != 0]
    if bad or reason == "failed":
        row.exit_code = bad[0].exit_code if bad else None
        return record(
            row, "failed", f"member {bad[0].member} exited with {_code(row.exit_code)}" if bad else "failed", now
        )
    row.exit_code = 0
    return record(row, "succeeded", "every member exited with code 0", now)
