"""Usage accounting and the cost report on a scripted scenario, checked against figures computed by hand."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.backends.base import MemberSample, Sample
from gpupool.control.policies import Policy, chains, effective, enforce
from gpupool.control.usage import account
from gpupool.lifecycle.events import EventCode, render
from gpupool.lifecycle.phases import AllocPhase, Phase, StopReason
from gpupool.services.auth import Principal
from gpupool.services.reports import usage
from gpupool.store.engine import make_engine, migrate, session_factory
from gpupool.store.tables import AllocationRow, NodeRow, QueueRow, QuotaRow, UsageRow, UserRow, WorkloadRow

T0 = 1_800_000_000.0  # a minute boundary


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    migrate(engine)
    with session_factory(engine)() as s:
        yield s


def _org(s: Session) -> dict[str, QueueRow]:
    dept = QueueRow(name="research", kind="department", created_at=0, policy={"idle_timeout": {"notebook": 600}})
    s.add(dept)
    s.flush()
    out = {"research": dept}
    for name in ("vision", "nlp"):
        q = QueueRow(name=name, kind="project", parent_id=dept.id, created_at=0, policy={})
        q.quotas.append(QuotaRow(pool="h100", deserved_milli=1000, limit_milli=None, weight=1))
        s.add(q)
        out[name] = q
    s.add(NodeRow(name="n1", backend="local", pool="h100", cpu_milli=8000, memory_mib=1, devices=[], updated_at=0))
    s.add_all(UserRow(id=i, name=n, role="member", created_at=0) for i, n in ((1, "ana"), (2, "bo")))
    s.flush()
    return out


def _running(s: Session, name: str, project: QueueRow, owner: int, milli: int, kind: str = "training") -> WorkloadRow:
    row = WorkloadRow(
        name=name, project_id=project.id, owner_id=owner, type=kind, priority_class="training", priority=100,
        preemptible=True, grace_s=30, state=Phase.RUNNING, created_at=T0, queued_at=T0, started_at=T0, allocations=[],
    )  # fmt: skip
    s.add(row)
    s.flush()
    row.allocations.append(
        AllocationRow(
            id=f"{row.id}-0-0",
            workload_id=row.id,
            attempt=0,
            member=0,
            node="n1",
            state=AllocPhase.READY,
            created_at=T0,
            devices=[{"index": 0, "milli": milli, "memory_mib": 0}],
        )
    )
    s.flush()
    return row


def test_usage_is_charged_by_share_and_time_and_split_by_utilisation(session: Session) -> None:
    org = _org(session)
    half = _running(session, "half", org["vision"], owner=1, milli=500)
    two = _running(session, "two", org["nlp"], owner=2, milli=2000)
    policies = {qid: effective(chain) for qid, chain in chains(list(org.values())).items()}
    nodes = {"n1": session.get(NodeRow, "n1")}
    busy = Sample({f"{half.id}-0-0": MemberSample(100, 0), f"{two.id}-0-0": MemberSample(25, 0)}, (), True)
    idle = Sample({f"{half.id}-0-0": MemberSample(0, 0), f"{two.id}-0-0": MemberSample(25, 0)}, (), True)
    # half: 60 s busy, then 120 s idle. two: 180 s at 25%.
    account(session, [half, two], busy, policies, nodes, T0, T0 + 60)  # type: ignore[arg-type]
    account(session, [half, two], idle, policies, nodes, T0 + 60, T0 + 180)  # type: ignore[arg-type]
    session.commit()
    assert half.idle_since == T0 + 60 and two.idle_since is None
    admin = Principal(0, "root", "admin", frozenset())
    report = usage(session, admin, T0, T0 + 3600, "project", {"h100": 2.0})
    lines = {line.key: line for line in report.lines}
    # half: 0.5 GPU × 180 s = 90 GPU-s = 0.025 GPU-h, of which 0.5 × 60 s = 30 GPU-s busy; at 2.00 per GPU-h.
    assert lines["vision"].gpu_hours == pytest.approx(0.025, abs=1e-5)
    assert lines["vision"].busy_gpu_hours == pytest.approx(30 / 3600, abs=1e-5)
    assert lines["vision"].cost == pytest.approx(0.05, abs=1e-5)
    assert lines["vision"].idle_cost == pytest.approx(60 / 3600 * 2.0, abs=1e-4)
    # two: 2 GPUs × 180 s = 0.1 GPU-h, a quarter of it busy.
    assert lines["nlp"].gpu_hours == pytest.approx(0.1, abs=1e-5)
    assert lines["nlp"].busy_gpu_hours == pytest.approx(0.025, abs=1e-5)
    assert report.total.cost == pytest.approx(0.05 + 0.2, abs=1e-5)
    by_user = {line.key: line.gpu_hours for line in usage(session, admin, T0, T0 + 3600, "user", {}).lines}
    assert by_user == {"ana": pytest.approx(0.025, abs=1e-5), "bo": pytest.approx(0.1, abs=1e-5)}
    by_dept = usage(session, admin, T0, T0 + 3600, "department", {}).lines
    assert [(d.key, d.gpu_hours) for d in by_dept] == [("research", pytest.approx(0.125, abs=1e-5))]
    # A member sees only the projects it belongs to.
    member = Principal(1, "ana", "member", frozenset({org["vision"].id}))
    assert [line.key for line in usage(session, member, T0, T0 + 3600, "project", {}).lines] == ["vision"]
    # Outside the period, nothing.
    assert usage(session, admin, T0 + 3600, T0 + 7200, "project", {}).lines == []


def test_policies_inherit_and_stop_idle_or_overlong_work(session: Session) -> None:
    org = _org(session)
    org["vision"].policy = {"idle_timeout": {"notebook": 300}, "max_runtime": {"training": 3600}}
    session.flush()
    pols = {qid: effective(chain) for qid, chain in chains(list(org.values())).items()}
    assert pols[org["vision"].id].idle_timeout_s == {"notebook": 300}
    assert pols[org["nlp"].id].idle_timeout_s == {"notebook": 600}  # inherited from research
    assert pols[org["nlp"].id].source == {"idle_timeout.notebook": "research"}
    nb = _running(session, "nb", org["vision"], owner=1, milli=250, kind="notebook")
    nb.idle_since = T0
    run = _running(session, "long", org["vision"], owner=1, milli=1000)
    other = _running(session, "nb2", org["nlp"], owner=2, milli=250, kind="notebook")
    other.idle_since = T0
    names = {r.id: r.name for r in (nb, run, other)}
    stopped = enforce([nb, run, other], pols, T0 + 400)
    assert [(names[e.workload_id], e.code, e.reason_code, e.args) for e in stopped] == [
        ("nb", EventCode.STOP_REQUESTED, StopReason.IDLE, {"idle_s": 400.0, "limit_s": 300.0})
    ]
    assert render(stopped[0].code, stopped[0].reason_code, stopped[0].args) == "idle for 6m40s (limit 5m); stopping"
    stopped = enforce([run, other], pols, T0 + 3600)
    assert [(names[e.workload_id], e.reason_code) for e in stopped] == [
        ("long", StopReason.MAX_RUNTIME),
        ("nb2", StopReason.IDLE),
    ]
    assert isinstance(pols[org["vision"].id], Policy)


def test_a_minute_on_a_rented_node_is_written_with_its_price(session: Session) -> None:
    org = _org(session)
    session.add(NodeRow(name="cloud/n2", backend="kubernetes", pool="h100", cpu_milli=8000, memory_mib=1, devices=[],
                        updated_at=0))  # fmt: skip
    here = _running(session, "here", org["vision"], owner=1, milli=1000)
    there = _running(session, "there", org["nlp"], owner=2, milli=1000)
    there.allocations[0].node = "cloud/n2"
    session.flush()
    policies = {qid: effective(chain) for qid, chain in chains(list(org.values())).items()}
    nodes = {n: session.get(NodeRow, n) for n in ("n1", "cloud/n2")}
    sample = Sample({f"{here.id}-0-0": MemberSample(50, 0), f"{there.id}-0-0": MemberSample(50, 0)}, (), True)
    account(session, [here, there], sample, policies, nodes, T0, T0 + 30,  # type: ignore[arg-type]
            burst_prices={"cloud/n2": 3_600_000})  # fmt: skip
    account(session, [here, there], sample, policies, nodes, T0 + 30, T0 + 59)  # type: ignore[arg-type]
    session.commit()
    rows = {
        (u.workload_id, u.minute): (u.milli_seconds, u.burst_price_micro) for u in session.scalars(select(UsageRow))
    }
    # One minute each; the second call (no prices given) adds to the row the first wrote, its price kept.
    assert rows == {
        (here.id, int(T0 // 60)): (59_000.0, None),
        (there.id, int(T0 // 60)): (59_000.0, 3_600_000),
    }
