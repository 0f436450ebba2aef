"""A decision written to the workload rows, and carried through to the requeue, without a server."""

from gpupool.backends.base import Observed
from gpupool.control.apply import persist
from gpupool.control.reconcile import reconcile
from gpupool.core import Decision, EvictReason, Pending, PendingCode, Placement
from gpupool.core.decision import Eviction
from gpupool.lifecycle.events import render
from gpupool.lifecycle.phases import AllocPhase, Phase, StopReason
from gpupool.store.snapshot import core_id
from gpupool.store.tables import AllocationRow, WorkloadRow


def running(wid: int, name: str) -> WorkloadRow:
    row = WorkloadRow(id=wid, name=name, type="training", state=Phase.RUNNING, attempt=0, nominated=[])
    row.allocations.append(
        AllocationRow(
            id=f"{wid}-0-0", workload_id=wid, attempt=0, member=0, node="n0", devices=[], state=AllocPhase.READY
        )
    )
    return row


def test_a_moved_workload_stops_for_its_eviction_and_restarts_where_it_was_nominated() -> None:
    moved, owed = running(1, "small"), running(2, "big")
    rows = {1: moved, 2: owed}
    decision = Decision(
        evictions=(Eviction(core_id(1), EvictReason.CONSOLIDATE, "moved to make room for 'big'", core_id(2)),),
        pending=(Pending(core_id(1), PendingCode.WAITING_FOR_EVICTIONS, "waiting", (Placement(0, "n1", ()),)),),
    )
    persist(rows, decision, now=10.0)
    assert moved.stop_reason == StopReason.CONSOLIDATE and moved.allocations[0].stop_at == 10.0
    # Its reason is the eviction's, not the nomination's, until it has stopped.
    assert render(moved.reason_event, moved.reason_code, moved.reason_args) == (
        "consolidate: moved to make room for 'big'; stopping"
    )
    assert moved.nominated == ["n1"]
    _, ended = reconcile([moved], {"1-0-0": Observed("1-0-0", alive=False, exit_code=0)}, now=12.0)
    assert ended == ["1-0-0"] and moved.state == Phase.PREEMPTED
    assert moved.nominated == ["n1"]  # it claims the GPU made free for it before anyone else


def test_a_reclaimed_workload_forgets_any_nomination_when_it_stops() -> None:
    victim = running(1, "victim")
    victim.nominated = ["n9"]
    persist({1: victim}, Decision(evictions=(Eviction(core_id(1), EvictReason.RECLAIM, "reclaimed", core_id(2)),)), 1.0)
    reconcile([victim], {}, now=2.0)
    assert victim.state == Phase.PREEMPTED and victim.nominated == []
