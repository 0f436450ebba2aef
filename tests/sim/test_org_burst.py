"""Bursting to a cloud in the organisation simulation (`sim/org_burst.py`): what a budget buys and what it costs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
from typer.testing import CliRunner

from gpupool.cli.main import app
from gpupool.core import Placement
from gpupool.core.burst import department_of
from gpupool.sim.org import GPU_MODEL, REGIMES, OrgSim, Record
from gpupool.sim.org_burst_report import BurstRun, burst_pool, run_budget_micro, simulate
from gpupool.sim.org_jobs import DAY, Organisation, build
from gpupool.sim.org_report import metrics
from gpupool.sim.traces import load_philly
from tests.sim.conftest import PHILLY

GPUS, DAYS = 32, 0.5
PRICE = 3.6
"""Dollars per GPU-hour: 1,000 micro-dollars per GPU-second, so every bill is a whole number of micro-dollars."""
POOL = burst_pool(GPUS, PRICE, delay_s=300.0, idle_s=600.0, gpu_model=GPU_MODEL)
BUDGET = 3_000.0
"""Dollars a month per department: $50 each for the half day."""


@pytest.fixture(scope="module")
def organisation() -> Organisation:
    return build(load_philly(PHILLY), gpus=GPUS, days=DAYS, seed=1)


@pytest.fixture(scope="module")
def without(organisation: Organisation) -> OrgSim:
    sim = OrgSim(organisation, dataclasses.replace(REGIMES["gpupool"], estimates=False), GPUS, DAYS * DAY)
    sim.run()
    return sim


class Watched(OrgSim):
    """Records, for every start on a burst node, the department of the work and the department renting it."""

    renters: ClassVar[list[tuple[str, str]]] = []

    def _start(self, rec: Record, placements: tuple[Placement, ...]) -> None:
        assert self.cloud is not None
        for p in placements:
            if p.node in self.cloud.held:
                tenant = department_of(self.queues, rec.job.project) or ""
                self.renters.append((tenant, self.cloud.held[p.node].department))
        super()._start(rec, placements)


def _run(organisation: Organisation, budget: float | None) -> OrgSim:
    run = BurstRun(organisation, GPUS, DAYS, POOL, 1_800.0, budget)
    regime = dataclasses.replace(REGIMES["gpupool"], estimates=False)
    sim = Watched(organisation, regime, GPUS, DAYS * DAY, burst=run.settings())
    sim.run()
    return sim


@pytest.fixture(scope="module")
def budgeted(organisation: Organisation) -> OrgSim:
    return _run(organisation, BUDGET)


@pytest.fixture(scope="module")
def zero(organisation: Organisation) -> OrgSim:
    return _run(organisation, 0.0)


def test_a_budget_lowers_the_p95_wait(without: OrgSim, budgeted: OrgSim) -> None:
    assert metrics(budgeted)["wait_p95_s"] < metrics(without)["wait_p95_s"]
    assert metrics(budgeted)["burst"]["nodes_asked"] > 0


def test_a_zero_budget_spends_nothing_and_changes_nothing(without: OrgSim, zero: OrgSim) -> None:
    figures = metrics(zero)
    burst = figures.pop("burst")
    assert burst["cost_usd"] == 0 and burst["gpu_hours"] == 0 and burst["nodes_asked"] == 0
    assert burst["refusals"]["over-budget"] > 0
    assert figures == metrics(without)


def test_the_bill_is_gpu_hours_times_the_price_exactly(budgeted: OrgSim) -> None:
    """Every node from its ask to its release (or the end): 8 GPUs x those seconds x 1,000 micro-dollars."""
    cloud = budgeted.cloud
    assert cloud is not None
    end = budgeted.horizon
    total_gpu_s = 0
    for dept in budgeted.org.departments:
        gpu_s = sum(
            8 * ((b.released_at if b.released_at is not None else end) - b.asked_at)
            for b in cloud.bills.values()
            if b.department == dept
        )
        assert gpu_s == int(gpu_s)
        assert cloud.spent_micro(dept, end) == int(gpu_s) * 1_000
        total_gpu_s += int(gpu_s)
    burst = metrics(budgeted)["burst"]
    assert total_gpu_s > 0
    assert round(burst["cost_usd"] * 1_000_000) == total_gpu_s * 1_000
    assert burst["gpu_hours"] == round(total_gpu_s / 3600, 3)


def test_no_department_spends_past_its_budget(budgeted: OrgSim) -> None:
    """A spent budget stops its work and its nodes go back within a tick: at most one tick of every burst GPU over."""
    budget = run_budget_micro(BUDGET, DAYS)
    assert budget == 50_000_000
    tick = GPUS * budgeted.interval * 1_000
    spent = metrics(budgeted)["burst"]["cost_usd_by_department"]
    assert max(spent.values()) > 0
    assert all(v * 1_000_000 <= budget + tick for v in spent.values())


def test_without_the_stop_running_work_finishes_past_the_budget(organisation: Organisation) -> None:
    """The department that reaches its budget (dept-2) lets its burst work finish, and pays for it."""
    lenient = BurstRun(organisation, GPUS, DAYS, POOL, 1_800.0, BUDGET, stop=False)
    spent = metrics(simulate(lenient))["burst"]["cost_usd_by_department"]
    assert spent["dept-2"] * 1_000_000 > run_budget_micro(BUDGET, DAYS) + GPUS * 60 * 1_000  # type: ignore[operator]


def test_only_the_renting_department_runs_on_a_burst_node(budgeted: OrgSim) -> None:
    assert Watched.renters
    assert all(tenant == renter for tenant, renter in Watched.renters)


def test_on_prem_figures_leave_burst_nodes_out(budgeted: OrgSim) -> None:
    assert all(a <= GPUS * 1000 for _, a, _ in budgeted.totals.timeline)
    assert budgeted.totals.burst_allocated_milli_s > 0


def test_a_monthly_budget_is_pro_rated_to_the_run() -> None:
    assert run_budget_micro(1_000.0, 3.0) == 100_000_000
    assert run_budget_micro(1_000.0, 0.25) == 8_333_333
    assert run_budget_micro(None, 3.0) is None


def _cli(tmp_path: Path, *args: str) -> Any:
    base = ["simulate", "org", "--trace", str(PHILLY), "--gpus", "16", "--days", "0.25", "--out", str(tmp_path)]
    return CliRunner().invoke(app, [*base, *args])


def test_cli_runs_one_budget_per_row(tmp_path: Path) -> None:
    result = _cli(tmp_path, "--burst-gpus", "16", "--budget", "0,1000", "--budget", "none", "--jobs", "1")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output.strip().splitlines()[-1])["burst"]
    assert [r["budget_usd_month"] for r in rows] == [0.0, 1000.0, None]
    assert rows[0]["burst_cost_usd"] == 0
    assert "| $1,000 ($8.33) |" in result.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [r["budget_usd_month"] for r in summary["burst"]["runs"]] == [0.0, 1000.0, None]
    assert summary["burst"]["pool"]["price_usd_per_gpu_hour"] == 2.5
    assert (tmp_path / "utilisation.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--budget", "1000"], "--burst-gpus"),
        (["--burst-gpus", "12"], "multiple of 8"),
        (["--burst-gpus", "16", "--budget", "lots"], "'lots'"),
        (["--burst-gpus", "16", "--burst-delay", "-1"], "negative"),
    ],
)
def test_cli_refuses_bad_burst_options(tmp_path: Path, args: list[str], message: str) -> None:
    result = _cli(tmp_path, *args)
    assert result.exit_code == 2 and message in result.output


def test_the_table_reads_the_simulation(organisation: Organisation) -> None:
    """`simulate` (the CLI's path) and a direct run of the same settings agree."""
    run = BurstRun(organisation, GPUS, DAYS, POOL, 1_800.0, BUDGET)
    assert metrics(simulate(run))["burst"] == metrics(_run(organisation, BUDGET))["burst"]
