"""Start-time estimates kept by the scheduler loop (gpupool.control.estimates), on the real app and store over
SQLite with real processes (sleeps) on simulated GPUs: runtimes from the store's finished work give estimates
their basis, estimates are written without stamping a row's version, and a forecast spread over cycles by its
time budget gives the estimate it gives in one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.control.forecast_process import ForecastProcess
from gpupool.lifecycle.phases import Phase
from gpupool.store.tables import QueueRow, UserRow, WorkloadRow
from tests.api.test_pending_reasons import _ok
from tests.observability.harness import Cluster, cluster

RUNTIMES = (600.0, 1800.0, 1200.0)
"""Of vision's finished training work: the model's median of them is 1200 s."""


class Ticks:
    """A timer that moves `each` seconds whenever it is read: every step of a forecast then costs `each`."""

    def __init__(self, each: float) -> None:
        self.each, self.now = each, 0.0

    def __call__(self) -> float:
        self.now += self.each
        return self.now


@pytest.fixture
def c(tmp_path: Path) -> Iterator[Cluster]:
    with cluster(tmp_path) as c:
        _ok(c, "POST", "/api/v1/projects", {"name": "vision", "deserved_gpus": 4})
        with c.api.ctx.sessions() as s:  # finished before this server's loop first ran
            project = s.query(QueueRow).filter_by(name="vision").one()
            owner = s.query(UserRow).first()
            assert owner is not None
            for i, runtime in enumerate(RUNTIMES):
                end = c.clock.now - 3600 + 60 * i
                s.add(
                    WorkloadRow(
                        name=f"done-{i}", project_id=project.id, owner_id=owner.id, type="training",
                        priority_class="training", priority=100, preemptible=True, grace_s=1,
                        state=Phase.SUCCEEDED, created_at=end - runtime, queued_at=end - runtime,
                        started_at=end - runtime, finished_at=end, allocations=[],
                    )
                )  # fmt: skip
            s.commit()
        yield c


def hog_and_waiter(c: Cluster, **hog_fields: object) -> float:
    """A running "hog" on vision's 4 GPUs, then a "waiter" for 1 queued behind it; the hog's start time."""
    hog = {"project": "vision", "name": "hog", "gpus": 4, "grace_s": 1, "command": ["sleep", "600"], **hog_fields}
    _ok(c, "POST", "/api/v1/workloads", hog)
    c.until(lambda: c.states()["hog"] == "running", "hog to run")
    started = c.row("hog").started_at
    assert started is not None
    waiter = {"project": "vision", "name": "waiter", "gpus": 1, "grace_s": 1, "command": ["sleep", "600"]}
    _ok(c, "POST", "/api/v1/workloads", waiter)
    return started


def test_runtimes_of_finished_work_give_the_estimate_which_is_written_without_a_new_version(c: Cluster) -> None:
    c.controller.estimates.forked = False  # stepped in the loop: each forecast within the cycle that starts it
    c.controller.estimates.budget_s = 600.0  # however loaded the machine
    started = hog_and_waiter(c)
    c.cycle()
    row = c.row("waiter")
    assert (row.eta, row.eta_basis) == (started + 1200.0, "history")
    version, forecasts = row.version, c.controller.estimates.forecasts
    c.cycle()  # nothing changed: no new forecast
    assert c.controller.estimates.forecasts == forecasts
    c.cycle(advance=60.0)  # the refresh is due: the same estimate again, so nothing is written
    again = c.row("waiter")
    assert (again.eta, again.eta_basis, again.version) == (started + 1200.0, "history", version)
    assert c.controller.estimates.forecasts == forecasts + 1


def test_a_forecast_spread_over_cycles_by_its_budget_gives_the_same_estimate(c: Cluster) -> None:
    started = hog_and_waiter(c)
    estimates = c.controller.estimates
    estimates.forked = False
    estimates.timer = Ticks(0.04)  # a step costs 0.04 s of a cycle's 0.1 s: one step a cycle
    cycles = 0
    while estimates.forecasts == 0:
        assert c.row("waiter").eta is None
        c.cycle()
        cycles += 1
    forecast = estimates.forecast
    assert forecast is not None
    assert (cycles, forecast.steps) == (3, 3)
    assert c.row("waiter").eta == started + 1200.0


def test_no_forecast_is_made_while_more_work_waits_than_the_cap(c: Cluster) -> None:
    estimates = c.controller.estimates
    estimates.forked = False  # the cap is the stepped forecast's: a forked one costs the loop no steps
    estimates.budget_s = 600.0  # a forecast within one cycle, however loaded the machine
    estimates.max_pending = 0  # one waiter is more than the cap
    hog_and_waiter(c)
    c.cycle()
    assert (estimates.forecasts, estimates.forecast, c.row("waiter").eta) == (0, None, None)
    estimates.max_pending = 1
    c.cycle(advance=60.0)
    assert estimates.forecasts == 1 and c.row("waiter").eta is not None


def test_a_forecast_in_a_child_process_gives_the_estimate_the_loop_would_and_stops_with_the_loop(c: Cluster) -> None:
    estimates = c.controller.estimates
    assert estimates.forked  # the default where the platform forks
    estimates.max_pending = 0  # the stepped forecast's cap does not hold a forked one back
    started = hog_and_waiter(c)
    c.cycle()
    child = estimates.forecast
    assert isinstance(child, ForecastProcess)
    c.until(lambda: c.row("waiter").eta is not None, "the child's estimate to be written")
    row = c.row("waiter")
    assert (row.eta, row.eta_basis, estimates.forecasts, estimates.failures) == (started + 1200.0, "history", 1, 0)
    assert (child.done, child.failed, child.pid) == (True, False, 0)  # reaped


def test_a_forecast_child_past_its_time_is_killed_and_writes_nothing_and_the_next_one_does(c: Cluster) -> None:
    estimates = c.controller.estimates
    estimates.timeout_s = 0.0
    started = hog_and_waiter(c)
    c.cycle()
    child = estimates.forecast
    assert isinstance(child, ForecastProcess)
    assert (child.done, child.failed, child.pid, estimates.failures, estimates.forecasts) == (True, True, 0, 1, 0)
    assert c.row("waiter").eta is None
    estimates.timeout_s = 600.0
    c.cycle(advance=60.0)  # the refresh is due
    c.until(lambda: c.row("waiter").eta is not None, "the next child's estimate")
    assert (c.row("waiter").eta, estimates.failures, estimates.forecasts) == (started + 1200.0, 1, 1)
