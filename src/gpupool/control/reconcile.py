"""What the backend observed, written back: members that ended, workloads that finished, failed or were stopped."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpupool.backends.base import Observed
from gpupool.lifecycle import transitions as lifecycle
from gpupool.lifecycle.events import EventCode
from gpupool.lifecycle.phases import LIVE, AllocPhase, StopReason
from gpupool.lifecycle.transitions import current
from gpupool.store.tables import EventRow, WorkloadRow


def reconcile(
    rows: Sequence[WorkloadRow],
    observed: dict[str, Observed] | None,
    now: float,
    unreachable: Callable[[str], bool] = lambda _: False,
) -> tuple[list[EventRow], list[str]]:
    """Returns the events, and the launches that ended: the caller tells the backend to forget them once this
    is committed, so a crash in between never loses how a member ended. An unsynced view (None) is "unknown":
    no member is concluded gone from it; nor is one on a node whose cluster was not reached (`unreachable`)."""
    events: list[EventRow] = []
    ended_now: list[str] = []
    if observed is None:
        return events, ended_now
    for row in rows:
        if row.state not in LIVE:
            continue
        allocs = current(row)
        details = _stop_details(row)
        for alloc in allocs:
            if alloc.state in (AllocPhase.BOUND, AllocPhase.ENDED) or unreachable(alloc.node):
                continue
            seen = observed.get(alloc.id)
            if seen is not None and seen.alive:
                if alloc.enforced != seen.enforced:  # set only on change: a set marks the row for the commit to check
                    alloc.enforced = seen.enforced
                continue
            lifecycle.move_alloc(alloc, AllocPhase.ENDED)
            alloc.exit_code = seen.exit_code if seen is not None else None
            if seen is not None and seen.reason is not None:
                details[alloc.member] = seen.reason
            if seen is not None and seen.lost and row.stop_reason is None:
                # Its node went away: not the workload's doing, so it goes back in the queue.
                events.append(_stopped(row, StopReason.NODE_LOST, now, node=alloc.node))
            ended_now.append(alloc.id)
        ended = [a for a in allocs if a.state == AllocPhase.ENDED]
        if not ended:
            continue
        if len(ended) == len(allocs):
            events.append(_with_detail(row, lifecycle.finish(row, now), details))
            continue
        bad = [a for a in ended if a.exit_code != 0]
        if bad and row.stop_reason is None:
            # One member failed: the rest of the gang cannot go on without it.
            failed = StopReason.MEMBER_FAILED
            why = {"detail": details[bad[0].member]} if bad[0].member in details else {}
            events.append(_stopped(row, failed, now, member=bad[0].member, exit_code=bad[0].exit_code, **why))
    return events, ended_now


def _stop_details(row: WorkloadRow) -> dict[int, str]:
    """The reason a gang's failed member gave, as its stop request noted it (that member was forgotten by the
    backend since; the workload fails once the rest have stopped)."""
    args = row.reason_args or {}
    asked = row.reason_event == EventCode.STOP_REQUESTED and row.stop_reason == StopReason.MEMBER_FAILED
    if asked and "detail" in args and "member" in args:
        return {int(args["member"]): str(args["detail"])}
    return {}


def _with_detail(row: WorkloadRow, event: EventRow, details: dict[int, str]) -> EventRow:
    """The event that ends an attempt on a member's failure names why it failed, where the backend said
    (`Observed.reason`), as its detail."""
    member = event.args.get("member")
    if event.reason_code != StopReason.MEMBER_FAILED or member not in details:
        return event
    current_reason = row.reason_event == event.code and row.reason_args == event.args
    event.args = {**event.args, "detail": details[member]}
    if current_reason:  # the workload's reason is this event's: it says the same
        row.reason_args = event.args
    return event


def _stopped(row: WorkloadRow, reason: StopReason, now: float, **args: object) -> EventRow:
    event = lifecycle.request_stop(row, reason, now, **args)
    assert event is not None  # the callers checked that no stop was asked before
    return event
