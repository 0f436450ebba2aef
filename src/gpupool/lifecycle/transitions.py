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
    RETRIES_ON,
    RETRY_BACKOFF_CAP_S,
    TERMINAL,
    AllocPhase,
    AttemptOutcome,
    PendingReason,
    Phase,
    RetryOn,
    StopReason,
)
from gpupool.store.tables import AllocationRow, EventRow, WorkloadRow


class IllegalTransition(RuntimeError):
    pass


_ENDS = frozenset({Phase.PREEMPTED, Phase.SUSPENDED, Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED})
_NEXT: dict[Phase, frozenset[Phase]] = {
    Phase.PENDING: frozenset({Phase.STARTING, Phase.CANCELLED}),
    Phase.PREEMPTED: frozenset({Phase.STARTING, Phase.CANCELLED}),
    Phase.SUSPENDED: frozenset({Phase.STARTING, Phase.CANCELLED}),
    # A live workload goes back to pending only to be retried (held through its backoff).
    Phase.STARTING: _ENDS | {Phase.PENDING, Phase.RUNNING},
    Phase.RUNNING: _ENDS | {Phase.PENDING},
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
    if to in TERMINAL:
        row.live_name = None  # its name is free for the next workload of its project
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
    row.live_name = row.name
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


def cancel(row: WorkloadRow, by: str, now: float, **args: Any) -> EventRow | None:
    """A queued workload ends at once; a live one is asked to stop and ends when its members are gone. `args`
    say more of why, where it was not its owner's doing (an offboarding: `offboarded`, `owner`, `project`)."""
    if phase(row) in QUEUED:
        row.finished_at = now
        row.hold, row.retry_at = False, None
        return _move(row, Phase.CANCELLED, EventCode.CANCELLED, now, by=by, **args)
    if row.stop_reason == StopReason.CANCEL:
        return None
    # A cancel overrides a stop already under way (an eviction would requeue it): the user wants it gone.
    row.stop_reason = None
    return request_stop(row, StopReason.CANCEL, now, by=by, **args)


def resume(row: WorkloadRow, by: str, now: float) -> EventRow:
    """A workload a policy suspended goes back in the queue, in its old place."""
    if phase(row) != Phase.SUSPENDED or not row.hold:
        raise IllegalTransition(f"workload {row.id} is {row.state}, not held by a policy")
    row.hold = False
    return _move(row, Phase.SUSPENDED, EventCode.RESUMED, now, by=by)


def finish(row: WorkloadRow, now: float) -> EventRow:
    """Every member of the current attempt has ended: what the workload becomes follows from why it stopped, and
    from its retry policy. The attempt is recorded in `attempts` by the same write, so a retry is decided once."""
    allocs = current(row)
    if any(a.state != AllocPhase.ENDED for a in allocs):
        raise IllegalTransition(f"workload {row.id}: finish with members still running")
    stop = StopReason(row.stop_reason) if row.stop_reason is not None else None
    args = dict(row.reason_args or {}) if row.reason_event == EventCode.STOP_REQUESTED else {}
    row.stop_reason = None
    if stop != StopReason.CONSOLIDATE:  # a moved workload restarts where it was nominated when it was moved
        row.nominated = []
    row.idle_since = None
    bad = [a for a in allocs if a.exit_code != 0]
    if stop is None and bad:
        stop = StopReason.MEMBER_FAILED
    if stop == StopReason.MEMBER_FAILED:
        args = {"member": bad[0].member, "exit_code": bad[0].exit_code} if bad else {}
    if stop in POLICY_STOPS:
        assert stop is not None
        _attempt(row, AttemptOutcome.STOPPED, stop, None, now, args)
        if row.type == "notebook":
            # Suspended, not requeued: its files stay; `gpupool resume` brings it back.
            _requeue(row)
            row.hold = True
            return _move(row, Phase.SUSPENDED, EventCode.SUSPENDED, now, stop.value, **args)
        row.finished_at = now
        return _move(row, Phase.FAILED, EventCode.FAILED, now, stop.value, **args)
    if stop in REQUEUES and row.type == "notebook":
        return _suspend(row, stop, args, now)
    if stop == StopReason.CANCEL:
        _attempt(row, AttemptOutcome.CANCELLED, stop, None, now)
        row.finished_at = now
        return _move(row, Phase.CANCELLED, EventCode.CANCELLED, now, **args)
    if stop is None:
        _attempt(row, AttemptOutcome.SUCCEEDED, None, 0, now)
        row.finished_at, row.exit_code = now, 0
        return _move(row, Phase.SUCCEEDED, EventCode.SUCCEEDED, now)
    exit_code = bad[0].exit_code if bad and stop == StopReason.MEMBER_FAILED else None
    outcome = AttemptOutcome.FAILED if stop == StopReason.MEMBER_FAILED else AttemptOutcome.REQUEUED
    policy = row.retry or {}
    retrying = bool(policy) and stop in RETRIES_ON[RetryOn(policy["on"])]
    allowed = int(policy.get("max_retries", 0))
    if retrying and retries_used(row) < allowed:
        return _retry(row, outcome, stop, exit_code, args, now)
    _attempt(row, outcome, stop, exit_code, now, args)
    if stop in REQUEUES and not retrying:
        _requeue(row)  # preemptible training and batch come back as preempted (notebooks: `_suspend`)
        return _move(row, Phase.PREEMPTED, EventCode.REQUEUED, now, stop.value, **args)
    row.finished_at, row.exit_code = now, exit_code
    if retrying:
        args["retries"] = allowed
    return _move(row, Phase.FAILED, EventCode.FAILED, now, stop.value, **args)


def _suspend(row: WorkloadRow, stop: StopReason, args: dict[str, Any], now: float) -> EventRow:
    """A notebook the scheduler stopped (preempted, reclaimed, moved, or its node lost): suspended with its files
    and queued again at once, not held, so it starts again by itself when there is room. It keeps its place
    (`queued_at` and its priority stay): it comes back before later work of its class. Never a retry, whatever
    its retry policy says: its owner did nothing, and a notebook waiting out a backoff, or failed after a few
    preemptions, would be one more way to lose it. Why and where it stopped stay in its last attempt (`args`: the
    stop's, such as `by`, `by_priority`, `by_project`, `pool`), which the edge renders as the owner's notice."""
    _attempt(row, AttemptOutcome.REQUEUED, stop, None, now, args)
    _requeue(row)
    return _move(row, Phase.SUSPENDED, EventCode.SUSPENDED, now, stop.value, **args)


def suspended_by(row: WorkloadRow) -> tuple[StopReason, float, dict[str, Any]] | None:
    """Why a suspended notebook stopped, when, and the stop's arguments (from its last attempt); None for any other
    row, or one whose attempts were not recorded."""
    if phase(row) != Phase.SUSPENDED or not row.attempts:
        return None
    last = row.attempts[-1]
    try:
        stop = StopReason(last.get("reason"))
    except ValueError:
        return None
    args = dict(last.get("args") or {})
    if not args and row.reason_event == EventCode.SUSPENDED:  # an attempt recorded before it kept its arguments
        args = {k: v for k, v in (row.reason_args or {}).items() if k != "detail"}
    return stop, float(last.get("ended") or 0.0), args


def retries_used(row: WorkloadRow) -> int:
    return sum(1 for a in row.attempts or [] if a.get("retried"))


def backoff_s(base_s: float, retry: int) -> float:
    """The wait before the `retry`-th retry (from 1): doubling from `base_s`, at most RETRY_BACKOFF_CAP_S."""
    return float(min(RETRY_BACKOFF_CAP_S, base_s * 2 ** min(retry - 1, 32)))


def _attempt(
    row: WorkloadRow, outcome: AttemptOutcome, stop: StopReason | None, exit_code: int | None, now: float,
    args: dict[str, Any] | None = None, retried: bool = False,
) -> None:  # fmt: skip
    entry: dict[str, Any] = {
        "number": row.attempt + 1, "started": row.started_at, "ended": now, "outcome": outcome.value,
        "reason": stop.value if stop is not None else None, "exit_code": exit_code, "retried": retried,
    }  # fmt: skip
    # The stop's arguments without the core's sentence: what a notice about this end is rendered from.
    kept = {k: v for k, v in (args or {}).items() if k != "detail"}
    if kept:
        entry["args"] = kept
    row.attempts = [*(row.attempts or []), entry]  # a new list: the JSON column is written only when replaced


def _retry(
    row: WorkloadRow, outcome: AttemptOutcome, stop: StopReason, exit_code: int | None, args: dict[str, Any],
    now: float,
) -> EventRow:  # fmt: skip
    """The same workload, held for its backoff and then queued again (`release`) as its next attempt."""
    assert row.retry is not None
    _attempt(row, outcome, stop, exit_code, now, args, retried=True)
    n = retries_used(row)
    wait = backoff_s(float(row.retry.get("backoff_s", 0.0)), n)
    _requeue(row)
    row.hold, row.retry_at = True, now + wait
    retry = {"attempt": row.attempt + 1, "retry": n, "max_retries": int(row.retry["max_retries"]), "backoff_s": wait}
    return _move(row, Phase.PENDING, EventCode.RETRYING, now, stop.value, **args, **retry)


def release(row: WorkloadRow, now: float) -> None:
    """A retry's backoff is over: it joins the queue (at its back) for the scheduler. No event: `retrying` said
    when this would happen."""
    if phase(row) != Phase.PENDING or not row.hold or row.retry_at is None:
        raise IllegalTransition(f"workload {row.id} is {row.state}, not waiting to be retried")
    row.hold, row.retry_at, row.queued_at = False, None, now


def replace(row: WorkloadRow, by: str, now: float) -> EventRow | None:
    """Another spec takes its name (an apply with force): it is cancelled as `cancel` does, and its name is free
    at once, though its members may still be stopping (with their grace period)."""
    event = cancel(row, by, now)
    row.live_name = None
    return event


def _requeue(row: WorkloadRow) -> None:
    row.attempt += 1
    row.started_at = None
