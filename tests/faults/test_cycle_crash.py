"""kill -9 (and injected errors) at each step of the scheduler loop: after the decision is committed, after the
launches but before their events, and between the members of a stop. A restarted server (same data dir and
store, no failpoint) finishes the work: every member launched exactly once, every stop carried through.

The cycle failpoints are reached by every cycle, idle ones too, so a test arms them on a server that has work
waiting for its very first cycle: a gang queued behind a blocker that ended while the server was down."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sqlalchemy.orm import Session

from gpupool.models.schemas import WorkloadCreate
from gpupool.store.engine import make_engine, migrate
from gpupool.store.tables import AllocationRow, NodeRow, QueueRow, UserRow, WorkloadRow
from tests.e2e.conftest import Server, wait_for
from tests.faults.conftest import (
    check_invariants,
    died,
    launches,
    member_sessions,
    recording,
    start_armed,
    states,
    store_url,
    violations,
    workloads,
)

FaultServer = Callable[..., Server]
RUNS = "sleep 300"


def _submit(s: Server, name: str, gpus: int, command: str, workers: int = 1, priority: str | None = None) -> list[str]:
    """Its allocation ids (of its first attempt)."""
    body = WorkloadCreate(
        project="p", name=name, gpus=gpus, workers=workers, priority=priority, command=recording(command)
    )
    wid = s.client().submit(body).id
    return [f"{wid}-0-{m}" for m in range(workers)]


def _queued_behind_a_blocker(s: Server) -> tuple[str, list[str]]:
    """Leaves `s` stopped with a gang of two queued, and the 4-GPU blocker it waited for ended while it was
    down. The blocker's allocation and the gang's."""
    [blocker] = _submit(s, "blocker", 4, "until [ -e go ]; do sleep 0.05; done")
    s.wait_state("blocker", "running")
    gang = _submit(s, "gang", 1, RUNS, workers=2)
    s.kill()
    (s.data_dir / "workloads" / blocker.split("-")[0] / "go").touch()
    wait_for(lambda: blocker not in member_sessions(s.data_dir), 20, "the blocker to end")
    assert states(s) == {"blocker": "running", "gang": "pending"}
    return blocker, gang


def _allocs(s: Server, name: str) -> dict[str, str]:
    return {a.id: a.state for w in workloads(s) if w.name == name for a in w.allocations}


def _stops(s: Server, name: str) -> list[tuple[str, str | None]]:
    """Its stop's events, once each whatever crashed in between."""
    codes = ("stop-requested", "requeued", "cancelled")
    return [(e.code, e.reason_code) for e in s.client().describe(name).events if e.code in codes]


def _started(s: Server, n: int) -> None:
    wait_for(lambda: sum(launches(s).values()) >= n, 20, f"{n} members to start")


def test_a_kill_after_the_decision_is_committed_launches_each_member_once_after_restart(
    fault_server: FaultServer,
) -> None:
    s = fault_server(None)
    blocker, gang = _queued_behind_a_blocker(s)
    died(start_armed(s, "cycle.after-persist=kill"))
    assert _allocs(s, "gang") == dict.fromkeys(gang, "bound")  # bound, and nothing started
    assert member_sessions(s.data_dir) == {}
    start_armed(s, None)
    s.wait_state("gang", "running")
    _started(s, 3)
    assert launches(s) == dict.fromkeys([blocker, *gang], 1)
    assert sorted(member_sessions(s.data_dir)) == gang
    check_invariants(s)


def test_a_kill_after_the_launches_before_their_events_adopts_the_members_and_never_relaunches(
    fault_server: FaultServer,
) -> None:
    s = fault_server(None)
    blocker, gang = _queued_behind_a_blocker(s)
    died(start_armed(s, "cycle.before-events=kill"))
    _started(s, 3)
    assert _allocs(s, "gang") == dict.fromkeys(gang, "bound")  # running, though the store never heard
    assert states(s) == {"blocker": "succeeded", "gang": "starting"}
    start_armed(s, None)
    s.wait_state("gang", "running")
    assert _allocs(s, "gang") == dict.fromkeys(gang, "ready")
    check_invariants(s)
    # The restarted server holds the members it adopted: a cancel stops them.
    s.client().cancel("gang")
    s.wait_state("gang", "cancelled")
    wait_for(lambda: member_sessions(s.data_dir) == {}, 20, "the adopted members to be gone")
    assert launches(s) == dict.fromkeys([blocker, *gang], 1)
    check_invariants(s)


def test_a_kill_between_the_members_of_a_cancel_finishes_the_cancel_after_restart(
    fault_server: FaultServer,
) -> None:
    s = fault_server("reclaim.during=kill")  # reached only while something stops
    gang = _submit(s, "gang", 1, RUNS, workers=2)
    s.wait_state("gang", "running")
    _started(s, 2)
    s.client().cancel("gang")
    died(s)
    # Member 0 was told to stop (it ends; its exit is kept for the next server); member 1 never was.
    wait_for(lambda: sorted(member_sessions(s.data_dir)) == gang[1:], 20, "member 0 alone to end")
    assert states(s) == {"gang": "running"}
    start_armed(s, None)
    s.wait_state("gang", "cancelled")
    assert member_sessions(s.data_dir) == {}
    assert _allocs(s, "gang") == dict.fromkeys(gang, "ended")
    assert _stops(s, "gang") == [("stop-requested", "cancel"), ("cancelled", None)]
    assert launches(s) == dict.fromkeys(gang, 1)
    check_invariants(s)


def test_a_kill_between_the_members_of_a_preemption_requeues_the_gang_once_after_restart(
    fault_server: FaultServer,
) -> None:
    s = fault_server("reclaim.during=kill")
    gang = _submit(s, "gang", 1, RUNS, workers=2, priority="batch")
    s.wait_state("gang", "running")
    _started(s, 2)
    [big] = _submit(s, "big", 4, RUNS, priority="training")
    died(s)
    wait_for(lambda: sorted(member_sessions(s.data_dir)) == gang[1:], 20, "member 0 alone to end")
    start_armed(s, None)
    s.wait_state("big", "running")
    _started(s, 3)
    assert states(s) == {"gang": "preempted", "big": "running"}
    assert _stops(s, "gang") == [("stop-requested", "preempt"), ("requeued", "preempt")]
    assert launches(s) == dict.fromkeys([*gang, big], 1)
    assert sorted(member_sessions(s.data_dir)) == [big]
    check_invariants(s)


def test_injected_errors_at_every_step_leave_the_loop_running_and_the_next_cycle_finishes_the_work(
    fault_server: FaultServer,
) -> None:
    s = fault_server(None)
    blocker, gang = _queued_behind_a_blocker(s)
    start_armed(s, "cycle.after-persist=raise,cycle.before-events=raise,reclaim.during=raise")
    assert s.proc is not None
    pid = s.proc.pid
    s.wait_state("gang", "running")
    _started(s, 3)
    s.client().cancel("gang")
    s.wait_state("gang", "cancelled")
    wait_for(lambda: member_sessions(s.data_dir) == {}, 20, "the members to be gone")
    assert s.proc is not None and s.proc.poll() is None and s.proc.pid == pid  # it never died
    log = s.log()
    for point in ("cycle.after-persist", "cycle.before-events", "reclaim.during"):
        assert f"FailpointError: failpoint {point}" in log, point
    assert launches(s) == dict.fromkeys([blocker, *gang], 1)
    check_invariants(s)


def test_the_invariants_checker_names_each_thing_broken(tmp_path: Path) -> None:
    """The checker itself, on a store written by hand: it must see what the fault tests count on it to see."""
    s = Server(tmp_path, None, "fake:1xH100-80GB", ())
    s.data_dir.mkdir()
    engine = make_engine(store_url(s))
    migrate(engine)
    with Session(engine) as session:
        session.add_all(
            [QueueRow(name="p", kind="project", created_at=0.0), UserRow(name="u", role="admin", created_at=0.0)]
        )
        session.add(
            NodeRow(
                name="vm",
                backend="local",
                pool="default",
                cpu_milli=1,
                memory_mib=1,
                updated_at=0.0,
                devices=[{"index": 0, "model": "H100", "memory_mib": 81920}],
            )
        )
        session.flush()

        def workload(wid: int, state: str, allocs: list[str], key: str | None = None) -> WorkloadRow:
            row = WorkloadRow(
                id=wid,
                name=f"w{wid}",
                project_id=1,
                owner_id=1,
                idempotency_key=key,
                type="training",
                priority_class="training",
                priority=100,
                preemptible=True,
                grace_s=1.0,
                state=state,
                created_at=0.0,
                queued_at=0.0,
                gpus=1,
            )
            device = [{"index": 0, "milli": 1000, "memory_mib": 81920}]
            row.allocations = [
                AllocationRow(
                    id=f"{wid}-0-{m}",
                    workload_id=wid,
                    attempt=0,
                    member=m,
                    node="vm",
                    devices=device,
                    state=a,
                    created_at=0.0,
                )
                for m, a in enumerate(allocs)
            ]
            return row

        session.add_all([workload(1, "running", ["ready"], "k1"), workload(2, "running", ["ready"])])
        session.add_all([workload(3, "pending", ["launched"]), workload(4, "succeeded", [])])
        session.commit()
    engine.dispose()
    (s.data_dir / "workloads" / "1").mkdir(parents=True)
    (s.data_dir / "workloads" / "1" / "starts").write_text("1-0-0\n1-0-0\n")
    assert violations(s, {"k1": 1, "k2": 5}) == [
        "allocation 3-0-0: launched while its workload is pending at attempt 0",
        "workload w4: succeeded without a finish time",
        "device vm/0: 3000 milli and 245760 MiB of 81920 promised",
        "submit k2 was acknowledged as workload 5; the store holds []",
        "allocation 1-0-0 started 2 times",
    ]
