"""A workload's max_duration at the API's edge, and start-time estimates end to end: the real app and scheduler
over SQLite on simulated GPUs, real processes (sleeps) running."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpupool.cli.workloads import describe_text, eta_text
from gpupool.models.schemas import WorkloadDetail, WorkloadPublic
from gpupool.store.snapshot import core_id
from tests.api.test_pending_reasons import _ok
from tests.control.test_estimates import hog_and_waiter
from tests.observability.harness import Cluster, cluster


@pytest.fixture
def c(tmp_path: Path) -> Iterator[Cluster]:
    with cluster(tmp_path) as c:
        yield c


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "Input should be greater than 0"),
        (-60, "Input should be greater than 0"),
        (1e12, "Input should be less than or equal to 2592000"),
        ("4h", "Input should be a valid number, unable to parse string as a number"),
    ],
)
def test_a_max_duration_that_is_not_a_positive_duration_of_at_most_30_days_is_refused(
    c: Cluster, value: Any, message: str
) -> None:
    _ok(c, "POST", "/api/v1/projects", {"name": "vision", "deserved_gpus": 1})
    body = {"project": "vision", "name": "j", "gpus": 1, "max_duration_s": value, "command": ["true"]}
    r = c.http("POST", "/api/v1/workloads", body)
    assert r.status_code == 422, r.text
    assert [(e["loc"][-1], e["msg"]) for e in r.json()["detail"]] == [("max_duration_s", message)]


def test_a_queued_job_behind_one_with_a_max_duration_gets_its_eta_and_its_start_records_estimate_and_wait(
    c: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    _ok(c, "POST", "/api/v1/projects", {"name": "vision", "deserved_gpus": 4})
    # Each forecast within the cycle that starts it, however loaded the machine (the budget is wall-clock time;
    # spreading one over cycles is tests/control/test_estimates.py's).
    c.controller.estimates.forked = False  # stepped in the loop (the forked forecast is test_estimates.py's)
    c.controller.estimates.budget_s = 600.0
    started = hog_and_waiter(c, max_duration_s=3600)
    c.cycle()

    d = _ok(c, "GET", "/api/v1/workloads/waiter?project=vision")
    assert (d["state"], d["eta_basis"]) == ("pending", "declared")
    assert datetime.fromisoformat(d["eta"]) == datetime.fromtimestamp(started + 3600, UTC)
    listed = {w["name"]: w for w in _ok(c, "GET", "/api/v1/workloads?project=vision")["items"]}
    assert (listed["waiter"]["eta"], listed["waiter"]["eta_basis"]) == (d["eta"], "declared")
    assert (listed["hog"]["eta"], listed["hog"]["eta_basis"]) == (None, None)  # running: no estimate
    queued_at = c.row("waiter").queued_at
    shown = WorkloadPublic.model_validate(listed["waiter"])
    # Half a second off the whole minute: the ETA is a float of microseconds, and a difference of exactly 3600
    # may come out a hair under it.
    assert eta_text(shown, now=started - 0.5) == "in 1h (declared)"
    assert eta_text(shown, now=started + 3590) == "now (declared)"
    assert eta_text(WorkloadPublic.model_validate(listed["hog"])) == "-"
    describe_text(WorkloadDetail.model_validate(d))
    at = datetime.fromtimestamp(started + 3600).strftime("%Y-%m-%d %H:%M:%S")
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("ETA:"))
    # The relative part is from the real clock, the ETA from the test's: some hours or minutes.
    basis = r"\(declared: from declared max durations and minimum runtimes\)"
    assert re.fullmatch(rf"ETA:         {at}, in \d+[dhm](\d+[hm])? {basis}", line), line

    c.cycle(advance=started + 3600 - c.clock.now)  # the hog's max duration is up: it is asked to stop
    # Estimated again (the refresh was due) a step (60 s) later, as the hog keeps its devices while it stops: a
    # move of a step or less is not written.
    forecast = c.controller.estimates.forecast
    assert forecast is not None and forecast.done
    assert forecast.estimates()[core_id(c.row("waiter").id)].start == started + 3660
    d = _ok(c, "GET", "/api/v1/workloads/waiter?project=vision")
    assert (d["state"], d["eta_basis"]) == ("pending", "declared")
    assert datetime.fromisoformat(d["eta"]) == datetime.fromtimestamp(started + 3600, UTC)
    c.until(lambda: c.states()["waiter"] == "running", "the waiter to start")
    d = _ok(c, "GET", "/api/v1/workloads/waiter?project=vision")
    assert (d["eta"], d["eta_basis"]) == (None, None)
    placed = [e for e in d["events"] if e["code"] == "placed"]
    assert len(placed) == 1
    args = placed[0]["args"]
    assert (args["eta"], args["eta_basis"]) == (started + 3600, "declared")  # the estimate it had
    assert args["estimated_wait_s"] == round(started + 3600 - queued_at, 3)
    assert args["waited_s"] == round(placed[0]["at"] - queued_at, 3)
    assert placed[0]["at"] - started > 3600  # it started once the hog had stopped
