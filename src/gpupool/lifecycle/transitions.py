"""The only way a workload's or an allocation's phase changes. Each function checks the step is allowed (an
illegal one raises: it is a bug in the caller), changes the row, and returns the event that records it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from gpupool.lifecycle.events import EventCode
from gpupool.lifecycle.phases import (
    LIVE,
    POLICY_STOPS,
    QUEUED,
    REQUEUES,
    AllocPhase,
    PendingReason,
    Phase,
    StopReason,
)
from gpupool.store.tables import AllocationRow, EventRow, WorkloadRow


class IllegalTransition(RuntimeError):
    pass


_NEXT: dict[Phase, frozenset[Phase]] = {
    Phase.PENDING: frozenset({Phase.STARTING, Phase.CANCELLED}),
    Phase.PREEMPTED: frozenset({Phase.STARTING, Phase.CANCELLED}),
    Phase.SUSPENDED: frozenset({Phase.STARTING, Phase.CANCELLED}),
    Phase.STARTING: frozenset(
        {Phase.RUNNING, Phase.PREEMPTED, Phase.SUSPENDED, Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED}
    ),
    Phase.RUNNING: frozenset({Phase.PREEMPTED, Phase.SUSPENDED, Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED}),
    Phase.SUCCEEDED: frozenset(),
    Phase.FAILED: frozenset(),
    Phase.CANCELLED: frozenset(),
}
_ALLOC_NEXT: dict[AllocPhase, frozenset[AllocPhase]] = {
    AllocPhase.BOUND: frozenset({AllocPhase.LAUNCHED, AllocPhase.ENDED}),
    AllocPhase.LAUNCHED: frozenset({AllocPhase.READY, AllocPhase.ENDED}),
    AllocPhase.READY: frozenset({AllocPhase.ENDED}),
    AllocPhase.ENDED: frozenset(),
}


def phase(row: WorkloadRow) -> Phase:
    return Phase(row.state)


def alloc_phase(alloc: AllocationRow) -> AllocPhase:
    return AllocPhase(alloc.state)


def _event(row: WorkloadRow, code: EventCode, reason: str | None, args: dict[str, Any], now: float) -> EventRow:
    row.reason_event, row.reason_code, row.reason_args = code.value, reason, args
    return EventRow(workload_id=row.id, at=now, state=row.state, code=code.value, reason_code=reason, args=args)


def _move(row: WorkloadRow, to: Phase, code: EventCode, now: float, reason: str | None = None, **args: Any) -> EventRow:
    was = phase(row)
    if to != was and to not in _NEXT[was]:
        raise IllegalTransition(f"workload {row.id}: {was} → {to} ({code})")
    row.state = to.value
    return _event(row, code, reason, args, now)


def current(row: WorkloadRow) -> list[AllocationRow]:
    """The allocations of its current attempt."""
    return [a for a in row.allocations if a.attempt == row.attempt]


def move_alloc(alloc: AllocationRow, to: AllocPhase) -> None:
    was = alloc_phase(alloc)
    if to != was and to not in _ALLOC_NEXT[was]:
        raise IllegalTransition(f"allocation {alloc.id}: {was} → {to}")
    alloc.state = to.value


def submitted(row: WorkloadRow, by: str, now: float) -> EventRow:
    """A new row enters the queue."""
    row.state = Phase.PENDING.value
    row.queued_at = now
    event = _event(row, EventCode.SUBMITTED, None, {"by": by}, now)
    row.reason_event, row.reason_code, row.reason_args = EventCode.QUEUED.value, PendingReason.WAITING.value, {}
    return event


def waiting(
    row: WorkloadRow, reason: PendingReason | str, detail: str, args: Iterable[tuple[str, int | str]] = ()
) -> bool:
    """Records why a queued workload still waits (no event: it is said again every cycle): the scheduler's code,
    its sentence (`detail`) and the numbers behind it (`args`, the core's, by name beside `detail`). Whether it
    changed."""
    if phase(row) not in QUEUED:
        raise IllegalTransition(f"workload {row.id} is {row.state}: only a queued workload waits")
    code = PendingReason(reason).value
    stored = waiting_args(detail, args)
    if row.reason_event == EventCode.QUEUED and row.reason_code == code and row.reason_args == stored:
        return False
    row.reason_event, row.reason_code, row.reason_args = EventCode.QUEUED.value, code, stored
    return True


def waiting_args(detail: str, args: Iterable[tuple[str, int | str]]) -> dict[str, Any]:
    """A waiting row's reason_args: the sentence as `detail`, then the scheduler's arguments in its order."""
    return {"detail": detail, **dict(args)}


def placed(row: WorkloadRow, nodes: Sequence[str], now: float) -> EventRow:
    row.started_at, row.nominated = now, []
    return _move(row, Phase.STARTING, EventCode.PLACED, now, nodes=sorted(set(nodes)))


def started(row: WorkloadRow, serving: bool, now: float) -> EventRow:
    """Every member launched (and, for an app, answering)."""
    for alloc in current(row):
        if alloc.state == AllocPhase.LAUNCHED:
            move_alloc(alloc, AllocPhase.READY)
    return _move(row, Phase.RUNNING, EventCode.SERVING if serving else EventCode.RUNNING, now)


def request_stop(row: WorkloadRow, reason: StopReason, now: float, **args: Any) -> EventRow | None:
    """Asks every live member to stop (the backend is told in the cycle's act step, with its grace period).
    None when a stop was already asked: the first reason is what the workload becomes."""
    if phase(row) not in LIVE:
        raise IllegalTransition(f"workload {row.id} is {row.state}: only a live workload can be stopped")
    if row.stop_reason is not None:
        return None
    row.stop_reason = reason.value
    for alloc in current(row):
        if alloc.state != AllocPhase.ENDED and alloc.stop_at is None:
            alloc.stop_at = now
    return _move(row, phase(row), EventCode.STOP_REQUESTED, now, reason.value, **args)


def cancel(row: WorkloadRow, by: str, now: float) -> EventRow | None:
    """A queued workload ends at once; a live one is asked to stop and ends when its members are gone."""
    if phase(row) in QUEUED:
        row.finished_at = now
        return _move(row, Phase.CANCELLED, EventCode.CANCELLED, now, by=by)
    if row.stop_reason == StopReason.CANCEL:
        return None
    # A cancel overrides a stop already under way (an eviction would requeue it): the user wants it gone.
    row.stop_reason = None
    return request_stop(row, StopReason.CANCEL, now, by=by)


def resume(row: WorkloadRow, by: str, now: float) -> EventRow:
    """A workload a policy suspended goes back in the queue, in its old place."""
    if phase(row) != Phase.SUSPENDED or not row.hold:
        raise IllegalTransition(f"workload {row.id} is {row.state}, not held by a policy")
    row.hold = False
    return _move(row, Phase.SUSPENDED, EventCode.RESUMED, now, by=by)


def finish(row: WorkloadRow, now: float) -> EventRow:
    """Every member of the current attempt has ended: what the workload becomes follows from why it stopped."""
    allocs = current(row)
    if any(a.state != AllocPhase.ENDED for a in allocs):
        raise IllegalTransition(f"workload {row.id}: finish with members still running")
    stop = StopReason(row.stop_reason) if row.stop_reason is not None else None
    args = dict(row.reason_args or {}) if row.reason_event == EventCode.STOP_REQUESTED else {}
    row.stop_reason = None
    if stop != StopReason.CONSOLIDATE:  # a moved workload restarts where it was nominated when it was moved
        row.nominated = []
    row.idle_since = None
    if stop in POLICY_STOPS:
        assert stop is not None
        if row.type == "notebook":
            # Suspended, not requeued: its files stay; `gpupool resume` brings it back.
            _requeue(row)
            row.hold = True
            return _move(row, Phase.SUSPENDED, EventCode.SUSPENDED, now, stop.value, **args)
        row.finished_at = now
        return _move(row, Phase.FAILED, EventCode.FAILED, now, stop.value, **args)
    if stop == StopReason.CANCEL:
        row.finished_at = now
        return _move(row, Phase.CANCELLED, EventCode.CANCELLED, now, **args)
    if stop in REQUEUES:
        assert stop is not None
        # Preemptible training and batch come back as preempted, notebooks as suspended (their files stay).
        _requeue(row)
        to = Phase.SUSPENDED if row.type == "notebook" else Phase.PREEMPTED
        return _move(row, to, EventCode.REQUEUED, now, stop.value, **args)
    row.finished_at = now
    bad = [a for a in allocs if a.exit_code != 0]
    if bad or stop == StopReason.MEMBER_FAILED:
        row.exit_code = bad[0].exit_code if bad else None
        failure = {"member": bad[0].member, "exit_code": row.exit_code} if bad else {}
        return _move(row, Phase.FAILED, EventCode.FAILED, now, StopReason.MEMBER_FAILED.value, **failure)
    row.exit_code = 0
    return _move(row, Phase.SUCCEEDED, EventCode.SUCCEEDED, now)


def _requeue(row: WorkloadRow) -> None:
    row.attempt += 1
    row.started_at = None
