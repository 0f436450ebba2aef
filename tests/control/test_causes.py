"""What an eviction's stop records beside the core's sentence: whom it made room for (named within its project
only), that one's priority class and project, and the pool the victim ran in."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from gpupool.control.apply import persist
from gpupool.control.causes import eviction_causes
from gpupool.core import Decision, EvictReason, Node, Placement, Request, Snapshot, State, Workload
from gpupool.core.decision import Eviction
from gpupool.lifecycle.phases import AllocPhase, Phase
from gpupool.store.engine import session_factory
from gpupool.store.snapshot import core_id
from gpupool.store.tables import AllocationRow, QueueRow, UserRow, WorkloadRow


@pytest.fixture
def session(migrated_engine: Engine) -> Iterator[Session]:
    with session_factory(migrated_engine)() as s:
        yield s


def _row(s: Session, wid: int, name: str, project: QueueRow) -> WorkloadRow:
    row = WorkloadRow(
        id=wid, name=name, project_id=project.id, owner_id=1, type="notebook", priority_class="interactive",
        priority=50, preemptible=True, grace_s=1.0, state=Phase.RUNNING.value, created_at=0.0, queued_at=0.0,
        attempt=0, nominated=[],
    )  # fmt: skip
    row.allocations.append(
        AllocationRow(
            id=f"{wid}-0-0", workload_id=wid, attempt=0, member=0, node="n1", devices=[], state="ready", created_at=0.0
        )
    )
    s.add(row)
    return row


def _core(wid: int, project: str, priority_class: str, running: bool) -> Workload:
    placed = (Placement(0, "n1", ()),) if running else ()
    state = State.RUNNING if running else State.PENDING
    return Workload(
        core_id(wid), project, Request(gpus=1), priority_class=priority_class, state=state, placements=placed
    )


def test_a_victim_learns_who_took_its_gpus_by_name_only_within_its_project(session: Session) -> None:
    session.add(UserRow(id=1, name="ana", role="member", created_at=0))
    lab, nlp = QueueRow(name="lab", kind="project", created_at=0), QueueRow(name="nlp", kind="project", created_at=0)
    session.add_all([lab, nlp])
    session.flush()
    nb1, nb2 = _row(session, 1, "nb1", lab), _row(session, 2, "nb2", lab)
    _row(session, 3, "train", lab)
    _row(session, 4, "secret-sweep", nlp)
    session.flush()
    snapshot = Snapshot(
        (Node("n1", "h100", 8000, 1024),), (),
        (_core(1, "lab", "interactive", True), _core(2, "lab", "interactive", True),
         _core(3, "lab", "training", False), _core(4, "nlp", "batch", False)),
    )  # fmt: skip
    decision = Decision(
        evictions=(
            Eviction(core_id(1), EvictReason.PREEMPT, "preempted by 'train'", core_id(3)),
            Eviction(core_id(2), EvictReason.RECLAIM, "reclaimed for a workload of project nlp", core_id(4)),
        )
    )
    causes = eviction_causes(session, decision, snapshot)
    assert causes == {
        core_id(1): {"by": "train", "by_priority": "training", "by_project": "lab", "pool": "h100"},
        core_id(2): {"by_priority": "batch", "by_project": "nlp", "pool": "h100"},
    }
    assert eviction_causes(session, Decision(), snapshot) == {}
    persist({1: nb1, 2: nb2}, decision, 5.0, causes)
    assert (nb1.stop_reason, nb1.reason_args) == (
        "preempt", {"detail": "preempted by 'train'", "by": "train", "by_priority": "training", "by_project": "lab",
                    "pool": "h100"},
    )  # fmt: skip
    assert nb2.reason_args == {
        "detail": "reclaimed for a workload of project nlp", "by_priority": "batch", "by_project": "nlp",
        "pool": "h100",
    }  # fmt: skip
    assert [a.state for a in nb1.allocations] == [AllocPhase.READY]  # asked to stop; the act step signals it
