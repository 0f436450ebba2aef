"""The lifecycle's transition functions: every allowed step, every refused one, and the events they leave."""

from __future__ import annotations

import pytest

from gpupool.core.decision import EvictReason, PendingCode
from gpupool.lifecycle import transitions as lc
from gpupool.lifecycle.events import EventCode, render
from gpupool.lifecycle.phases import EVICTIONS, AllocPhase, PendingReason, Phase, StopReason
from gpupool.lifecycle.transitions import IllegalTransition
from gpupool.store.tables import AllocationRow, WorkloadRow


def _row(kind: str = "training", members: int = 1) -> WorkloadRow:
    row = WorkloadRow(id=7, name="w", type=kind, attempt=0, nominated=[], allocations=[], hold=False)
    lc.submitted(row, "ana", 1.0)
    return row


def _placed(kind: str = "training", members: int = 1) -> WorkloadRow:
    row = _row(kind)
    for m in range(members):
        row.allocations.append(
            AllocationRow(id=f"7-0-{m}", workload_id=7, attempt=0, member=m, node="n1", devices=[], state="bound")
        )
    lc.placed(row, ["n1"], 2.0)
    for a in row.allocations:
        lc.move_alloc(a, AllocPhase.LAUNCHED)
    return row


def _end_all(row: WorkloadRow, code: int | None = 0) -> None:
    for a in lc.current(row):
        lc.move_alloc(a, AllocPhase.ENDED)
        a.exit_code = code


def text(row: WorkloadRow) -> str:
    return render(row.reason_event, row.reason_code, row.reason_args)


def test_the_lifecycle_knows_every_pending_code_the_scheduler_gives() -> None:
    assert {c.value for c in PendingCode} <= {r.value for r in PendingReason}
    assert {r.value for r in EvictReason} <= {r.value for r in StopReason}


def test_a_submitted_workload_waits_then_runs_and_succeeds() -> None:
    row = _row()
    assert (row.state, row.reason_code, text(row)) == (
        Phase.PENDING,
        PendingReason.WAITING,
        "waiting for the scheduler",
    )
    assert lc.waiting(row, PendingReason.NO_NODE_FITS, "no node in h100 has 2 GPUs") is True
    assert lc.waiting(row, PendingReason.NO_NODE_FITS, "no node in h100 has 2 GPUs") is False  # unchanged
    assert text(row) == "no node in h100 has 2 GPUs"
    row.allocations.append(
        AllocationRow(id="7-0-0", workload_id=7, attempt=0, member=0, node="n1", devices=[], state="bound")
    )
    placed = lc.placed(row, ["n1"], 2.0)
    assert (placed.state, placed.code, placed.args) == (Phase.STARTING, EventCode.PLACED, {"nodes": ["n1"]})
    lc.move_alloc(row.allocations[0], AllocPhase.LAUNCHED)
    event = lc.started(row, serving=False, now=3.0)
    assert (event.state, event.code, row.allocations[0].state) == (Phase.RUNNING, EventCode.RUNNING, AllocPhase.READY)
    _end_all(row)
    done = lc.finish(row, 4.0)
    assert (done.state, done.code, row.exit_code, render(done.code, done.reason_code, done.args)) == (
        Phase.SUCCEEDED, EventCode.SUCCEEDED, 0, "every member exited with code 0",
    )  # fmt: skip


@pytest.mark.parametrize(("kind", "after"), [("training", Phase.PREEMPTED), ("batch", Phase.PREEMPTED)])
def test_an_eviction_requeues_in_the_old_place(kind: str, after: Phase) -> None:
    row = _placed(kind)
    stop = lc.request_stop(row, StopReason.RECLAIM, 5.0, detail="reclaimed for 'big'")
    assert stop is not None and (stop.code, stop.reason_code) == (EventCode.STOP_REQUESTED, StopReason.RECLAIM)
    assert [a.stop_at for a in row.allocations] == [5.0]
    assert lc.request_stop(row, StopReason.PREEMPT, 6.0, detail="x") is None  # the first reason holds
    _end_all(row, None)
    event = lc.finish(row, 7.0)
    assert (row.state, row.attempt, row.started_at, row.stop_reason) == (after, 1, None, None)
    assert render(event.code, event.reason_code, event.args) == "requeued after reclaim: reclaimed for 'big'"


CAUSE = {"by": "train", "by_priority": "training", "by_project": "lab", "pool": "h100"}


@pytest.mark.parametrize("stop", [StopReason.PREEMPT, StopReason.RECLAIM, StopReason.CONSOLIDATE])
def test_a_notebook_the_scheduler_stops_is_suspended_and_queued_again_in_its_old_place(stop: StopReason) -> None:
    row = _placed("notebook")
    row.priority = 50
    lc.request_stop(row, stop, 5.0, detail="preempted by 'train'", **CAUSE)
    _end_all(row, None)
    event = lc.finish(row, 7.0)
    # Queued again at once, not held: the scheduler starts it when it fits, before later work of its class.
    assert (row.state, row.hold, row.retry_at, row.attempt, row.started_at) == (Phase.SUSPENDED, False, None, 1, None)
    assert (row.queued_at, row.priority) == (1.0, 50)
    assert (event.state, event.code, event.reason_code) == (Phase.SUSPENDED, EventCode.SUSPENDED, stop)
    assert event.args == {"detail": "preempted by 'train'", **CAUSE}
    assert render(event.code, event.reason_code, event.args) == (
        f"suspended after {stop.value}: preempted by 'train'; it resumes by itself when there is room"
    )
    # Why, when and where are kept in its last attempt (the queued reason is the scheduler's from now on).
    assert row.attempts == [
        {"number": 1, "started": 2.0, "ended": 7.0, "outcome": "requeued", "reason": stop.value, "exit_code": None,
         "retried": False, "args": CAUSE},
    ]  # fmt: skip
    assert lc.suspended_by(row) == (stop, 7.0, CAUSE)
    assert lc.waiting(row, PendingReason.NO_NODE_FITS, "no node has 1 free GPU now") is True
    assert lc.suspended_by(row) == (stop, 7.0, CAUSE)
    back = lc.placed(row, ["n1"], 9.0)
    assert (back.state, row.state, row.started_at, lc.suspended_by(row)) == (Phase.STARTING, Phase.STARTING, 9.0, None)


@pytest.mark.parametrize("on", ["on-preemption", "always"])
def test_a_preempted_notebook_is_suspended_whatever_its_retry_policy_while_training_uses_its_retries(on: str) -> None:
    notebook, training = _placed("notebook"), _placed("training")
    for row in (notebook, training):
        row.retry = {"on": on, "max_retries": 0, "backoff_s": 10.0}
        lc.request_stop(row, StopReason.PREEMPT, 5.0, detail="x", **CAUSE)
        _end_all(row, None)
    suspended, failed = lc.finish(notebook, 6.0), lc.finish(training, 6.0)
    assert (notebook.state, notebook.hold, notebook.retry_at, lc.retries_used(notebook)) == (
        Phase.SUSPENDED, False, None, 0,
    )  # fmt: skip
    assert suspended.code == EventCode.SUSPENDED
    assert (training.state, failed.code, failed.args["retries"]) == (Phase.FAILED, EventCode.FAILED, 0)


def test_a_notebook_whose_member_fails_is_not_suspended() -> None:
    row = _placed("notebook")
    _end_all(row, 1)
    event = lc.finish(row, 6.0)
    assert (row.state, event.code, lc.suspended_by(row)) == (Phase.FAILED, EventCode.FAILED, None)


def test_a_policy_suspends_a_notebook_and_holds_it_until_resumed() -> None:
    row = _placed("notebook")
    lc.request_stop(row, StopReason.IDLE, 10.0, idle_s=400.0, limit_s=300.0)
    _end_all(row)
    event = lc.finish(row, 11.0)
    assert (row.state, row.hold, row.reason_code) == (Phase.SUSPENDED, True, StopReason.IDLE)
    assert render(event.code, event.reason_code, event.args) == "idle for 6m40s (limit 5m); resume it to start again"
    assert lc.suspended_by(row) == (StopReason.IDLE, 11.0, {"idle_s": 400.0, "limit_s": 300.0})
    resumed = lc.resume(row, "bo", 12.0)
    assert (row.state, row.hold, resumed.code, text(row)) == (
        Phase.SUSPENDED,
        False,
        EventCode.RESUMED,
        "resumed by bo",
    )


def test_a_policy_fails_other_work() -> None:
    row = _placed("training")
    lc.request_stop(row, StopReason.MAX_RUNTIME, 10.0, ran_s=3600.0, limit_s=3600.0)
    _end_all(row, None)
    event = lc.finish(row, 11.0)
    assert (row.state, row.finished_at) == (Phase.FAILED, 11.0)
    assert render(event.code, event.reason_code, event.args) == "stopped by policy: ran for 1h (limit 1h)"


def test_one_failed_member_stops_the_gang_and_fails_it() -> None:
    row = _placed(members=2)
    lc.move_alloc(row.allocations[0], AllocPhase.ENDED)
    row.allocations[0].exit_code = 3
    stop = lc.request_stop(row, StopReason.MEMBER_FAILED, 5.0, member=0, exit_code=3)
    assert (
        stop is not None and render(stop.code, stop.reason_code, stop.args) == "member 0 exited with code 3; stopping"
    )
    assert row.allocations[1].stop_at == 5.0 and row.allocations[0].stop_at is None
    with pytest.raises(IllegalTransition):
        lc.finish(row, 6.0)  # member 1 still runs
    _end_all(row, None)
    row.allocations[0].exit_code = 3
    event = lc.finish(row, 7.0)
    assert (row.state, row.exit_code, render(event.code, event.reason_code, event.args)) == (
        Phase.FAILED, 3, "member 0 exited with code 3",
    )  # fmt: skip


def test_cancel_ends_queued_work_at_once_and_overrides_an_eviction_under_way() -> None:
    queued = _row()
    event = lc.cancel(queued, "ana", 2.0)
    assert event is not None and (queued.state, queued.finished_at) == (Phase.CANCELLED, 2.0)
    live = _placed()
    lc.request_stop(live, StopReason.PREEMPT, 3.0, detail="preempted by 'x'")
    assert lc.cancel(live, "ana", 4.0) is not None
    assert lc.cancel(live, "ana", 5.0) is None  # asked once
    _end_all(live, None)
    done = lc.finish(live, 6.0)
    assert (live.state, render(done.code, done.reason_code, done.args)) == (Phase.CANCELLED, "cancelled by ana")


def test_a_waiting_reason_keeps_the_schedulers_numbers_beside_its_sentence() -> None:
    row = _row()
    quota = (("queue", "vision"), ("level", "project"), ("pool", "h100"), ("used", 6000), ("quota", 8000))
    sentence = "vision would exceed its limit of 8 GPUs in pool h100 (using 6, asks 4)"
    assert lc.waiting(row, PendingReason.OVER_LIMIT, sentence, (*quota, ("asks", 4000))) is True
    assert row.reason_args == {
        "detail": sentence, "queue": "vision", "level": "project", "pool": "h100", "used": 6000, "quota": 8000,
        "asks": 4000,
    }  # fmt: skip
    assert list(row.reason_args) == ["detail", "queue", "level", "pool", "used", "quota", "asks"]
    assert lc.waiting(row, PendingReason.OVER_LIMIT, sentence, (*quota, ("asks", 4000))) is False  # unchanged
    assert lc.waiting(row, PendingReason.OVER_LIMIT, sentence, (*quota, ("asks", 2000))) is True  # a number moved
    assert row.reason_args["asks"] == 2000
    assert text(row) == sentence


@pytest.mark.parametrize("terminal", [Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED])
def test_nothing_leaves_a_terminal_phase(terminal: Phase) -> None:
    row = _row()
    row.state = terminal.value
    with pytest.raises(IllegalTransition):
        lc.placed(row, ["n1"], 1.0)
    with pytest.raises(IllegalTransition):
        lc.cancel(row, "ana", 1.0)
    with pytest.raises(IllegalTransition):
        lc.waiting(row, PendingReason.NO_NODE_FITS, "x")


def test_illegal_steps_are_errors() -> None:
    row = _row()
    with pytest.raises(IllegalTransition):
        lc.started(row, serving=False, now=1.0)  # pending → running skips starting
    with pytest.raises(IllegalTransition):
        lc.request_stop(row, StopReason.RECLAIM, 1.0)  # nothing to stop
    with pytest.raises(IllegalTransition):
        lc.resume(row, "ana", 1.0)  # not suspended
    alloc = AllocationRow(id="a", workload_id=7, attempt=0, member=0, node="n", devices=[], state="ended")
    with pytest.raises(IllegalTransition):
        lc.move_alloc(alloc, AllocPhase.LAUNCHED)
    with pytest.raises(ValueError, match="'running' is not a valid AllocPhase"):
        lc.move_alloc(AllocationRow(id="b", state="running"), AllocPhase.ENDED)


def test_evictions_counted_are_the_scheduler_and_policy_stops() -> None:
    assert sorted(EVICTIONS) == [
        "burst-budget", "cluster-lost",
        "consolidate", "gang-broken", "idle", "max-runtime", "node-lost", "preempt", "reclaim"
    ]  # fmt: skip
