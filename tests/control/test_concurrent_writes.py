"""A user's cancel lands while a scheduling cycle is under way (between its reads and its commit, or between its
launches and their record): it never waits for the cycle, and the cycle's commit never undoes it. The real app,
store and local backend (simulated GPUs, real processes), on SQLite and PostgreSQL; the cancel is sent from inside
the backend's call at the moment under test."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import event, select

from gpupool.backends.base import Backend, LaunchSpec, Sample
from gpupool.control import controller as controller_module
from gpupool.control.controller import Controller
from gpupool.store import changes
from gpupool.store.tables import AllocationRow, EventRow, WorkloadRow
from tests.api.inprocess import Api, make_api


class Interrupting:
    """The server's backend, with a hook run once inside its next sample() or launch()."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.on_sample: Callable[[], None] | None = None
        self.on_launch: Callable[[], None] | None = None
        self.launched: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def sample(self) -> Sample:
        hook, self.on_sample = self.on_sample, None
        if hook is not None:
            hook()
        return self.inner.sample()

    def launch(self, spec: LaunchSpec) -> None:
        self.inner.launch(spec)
        self.launched.append(spec.alloc_id)
        hook, self.on_launch = self.on_launch, None
        if hook is not None:
            hook()


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


class Rig:
    def __init__(self, api: Api) -> None:
        self.api = api
        # On PostgreSQL the server's backend acts only while its server leads; this test's controller acts alone.
        self.backend = Interrupting(getattr(api.ctx.backend, "inner", api.ctx.backend))
        api.ctx.backend = self.backend  # type: ignore[assignment]
        self.clock = Clock()
        # A controller of the test's own, with no leader's fence: it runs a cycle when the test says.
        self.controller = Controller(
            api.ctx.sessions,
            self.backend,
            clock=self.clock,
            telemetry_interval_s=0.0,  # type: ignore[arg-type]
        )
        self.controller.register_nodes()
        api.ctx.controller = self.controller
        self.http("POST", "/api/v1/departments", {"name": "d", "deserved_gpus": 1})
        self.http("POST", "/api/v1/projects", {"name": "lab", "department": "d", "deserved_gpus": 1})

    def http(self, method: str, path: str, body: Any = None) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.api.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
                return await c.request(method, path, json=body, headers=self.api.auth())

        r = asyncio.run(go())
        assert r.status_code < 300, (method, path, r.status_code, r.text)
        return r

    def submit(self, name: str) -> None:
        body = {"project": "lab", "name": name, "gpus": 1, "grace_s": 5, "command": ["sleep", "600"]}
        self.http("POST", "/api/v1/workloads", body)

    def cancel(self, name: str) -> None:
        self.http("POST", f"/api/v1/workloads/{name}/cancel?project=lab")

    def row(self, name: str) -> WorkloadRow:
        with self.api.ctx.sessions() as s:
            found = s.scalar(select(WorkloadRow).where(WorkloadRow.name == name))
            assert found is not None
            return found

    def codes(self, name: str) -> list[str]:
        with self.api.ctx.sessions() as s:
            wid = self.row(name).id
            return [
                e.code for e in s.scalars(select(EventRow).where(EventRow.workload_id == wid).order_by(EventRow.id))
            ]

    def until(self, name: str, state: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.row(name).state != state:
            assert time.monotonic() < deadline, f"{name} is {self.row(name).state}, not {state}"
            self.controller.cycle()
            time.sleep(0.05)


@pytest.fixture(params=["sqlite", "postgresql"])
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rig]:
    url = None if request.param == "sqlite" else request.getfixturevalue("postgres").new_database()
    api = make_api(tmp_path, gpus="fake:1xH100-80GB", db_url=url)
    try:
        yield Rig(api)
    finally:
        api.close()


def test_a_cancel_racing_a_policy_stop_is_kept(rig: Rig) -> None:
    rig.http("PATCH", "/api/v1/queues/lab/policy", {"max_runtime_s": {"training": 60}})
    rig.submit("job")
    rig.until("job", "running")
    # The next cycle finds the job over its runtime, but the user's cancel lands after the cycle read the row.
    rig.clock.now += 120
    rig.backend.on_sample = lambda: rig.cancel("job")
    rig.controller.cycle()
    job = rig.row("job")
    assert (job.state, job.stop_reason) == ("running", "cancel")
    rig.until("job", "cancelled")
    assert rig.codes("job") == ["submitted", "placed", "running", "stop-requested", "cancelled"]


def test_a_cancel_between_a_launch_and_its_record_is_kept_and_the_member_stopped(rig: Rig) -> None:
    rig.submit("job")
    rig.backend.on_launch = lambda: rig.cancel("job")
    rig.controller.cycle()  # binds, launches, and would record the job running
    job = rig.row("job")
    with rig.api.ctx.sessions() as s:
        members = [(a.id, a.state, a.stop_at is not None) for a in s.scalars(select(AllocationRow))]
    assert (job.state, job.stop_reason) == ("starting", "cancel")
    assert members == [(f"{job.id}-0-0", "launched", True)]  # launched, as the backend did: it is stopped next
    rig.until("job", "cancelled")
    assert rig.codes("job") == ["submitted", "placed", "stop-requested", "cancelled"]
    assert rig.backend.launched == [f"{job.id}-0-0"]


def test_a_pending_workload_cancelled_before_its_bind_is_written_is_not_started(rig: Rig) -> None:
    rig.submit("job")
    rig.backend.on_sample = lambda: rig.cancel("job")
    rig.controller.cycle()
    rig.controller.cycle()
    assert rig.row("job").state == "cancelled"
    assert rig.codes("job") == ["submitted", "cancelled"]
    assert rig.backend.launched == []


def test_cancel_and_resume_do_not_wait_for_a_cycle(rig: Rig) -> None:
    rig.submit("job")
    done = threading.Event()
    with rig.controller.lock:  # as a cycle holds it, from its first read to its last commit
        worker = threading.Thread(target=lambda: (rig.cancel("job"), done.set()))
        worker.start()
        assert done.wait(10)
    worker.join()
    assert rig.row("job").state == "cancelled"


def test_a_steady_cycle_writes_no_workload_row_it_did_not_change(rig: Rig) -> None:
    for name in ("a", "b", "c"):
        rig.submit(name)
    rig.until("a", "running")
    rig.controller.telemetry_interval_s = 3600.0  # no sample: it writes the running row's utilisation
    rig.controller.cycle()
    # The queued rows' first estimates come from a forked forecast that a later cycle writes (once): a loaded
    # machine may finish it only after the cycle measured below, so they are written before it.
    deadline = time.monotonic() + 30
    while rig.controller.estimates.forecasts == 0:
        assert time.monotonic() < deadline, "no forecast was written"
        rig.controller.cycle()
        time.sleep(0.05)
    engine = rig.api.ctx.sessions.kw["bind"]
    writes: list[str] = []

    def note(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE WORKLOADS"):
            writes.append(statement)

    event.listen(engine, "before_cursor_execute", note)
    try:
        rig.controller.cycle()
    finally:
        event.remove(engine, "before_cursor_execute", note)
    assert writes == []
    assert rig.row("b").reason_code == rig.row("c").reason_code == "no-node-fits"


def test_a_cycle_after_a_long_pause_reads_everything_again(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    rig.submit("a")
    rig.submit("b")
    rig.until("a", "running")
    b = rig.row("b")
    assert b.reason_code == "no-node-fits"
    # Another leader, while this server did not lead, gave b a reason the way schedulers write them: unstamped.
    other = {"wid": b.id, "seen": b.version, "reason_event": "queued", "reason_code": "over-limit",
             "reason_args": {"detail": "over the limit"}, "nominated": []}  # fmt: skip
    with rig.api.ctx.sessions() as s:
        changes.note_waiting(s, [other])
        s.commit()
    rig.controller.cycle()
    assert rig.row("b").reason_code == "over-limit"  # unstamped: a cycle that keeps its view does not see it
    monkeypatch.setattr(controller_module, "STALE_VIEW_S", 0.0)
    rig.controller.interval_s = 0.0
    rig.controller.cycle()
    assert rig.row("b").reason_code == "no-node-fits"
