"""Per-job GPU utilisation in the organisation simulation, and right-sizing followers."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool.cli.main import app
from gpupool.sim import org_jobs
from gpupool.sim.org import REGIMES, OrgSim
from gpupool.sim.org_jobs import DAY, HOUR, Organisation, OrgJob, build
from gpupool.sim.org_report import metrics
from gpupool.sim.org_util import advised_milli, followed, idle_share, rightsize
from gpupool.sim.traces import load_philly
from tests.sim.conftest import PHILLY

GPUS, DAYS = 32, 0.5


@pytest.fixture(scope="module")
def organisation() -> Organisation:
    return build(load_philly(PHILLY), gpus=GPUS, days=DAYS, seed=3)


def test_idle_share_follows_the_philly_figures() -> None:
    assert idle_share(HOUR) == 0.49
    assert idle_share(6 * HOUR) == 0.49
    assert idle_share(12 * HOUR) == pytest.approx(0.37)
    assert idle_share(24 * HOUR) == 0.25
    assert idle_share(30 * DAY) == 0.25


def test_busy_shares_are_drawn_around_the_anchors(organisation: Organisation) -> None:
    short = [j.busy_fraction for j in organisation.jobs if j.kind in ("training", "batch") and j.work <= 6 * HOUR]
    assert abs(statistics.fmean(short) - 0.51) < 0.05
    assert all(0 <= j.busy_fraction <= 1 for j in organisation.jobs)
    services = [j.busy_fraction for j in organisation.jobs if j.kind == "inference"]
    assert all(0 < b < 1 for b in services)
    assert organisation == build(load_philly(PHILLY), gpus=GPUS, days=DAYS, seed=3)


def test_utilisation_changes_no_other_part_of_the_organisation(
    organisation: Organisation, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(org_jobs, "utilisation", lambda jobs, seed: jobs)
    without = build(load_philly(PHILLY), gpus=GPUS, days=DAYS, seed=3)
    assert without.deserved_gpus == organisation.deserved_gpus
    assert without.jobs == tuple(
        dataclasses.replace(j, busy_fraction=w.busy_fraction, peak_memory_share=1.0)
        for j, w in zip(organisation.jobs, without.jobs, strict=True)
    )


def _job(busy: float, memory: float, work: float = 2 * HOUR, gpus: int = 1, members: int = 1) -> OrgJob:
    return OrgJob("j", "p", "training", 0.0, work, gpus=gpus, members=members, busy_fraction=busy,
                  peak_memory_share=memory)  # fmt: skip


def test_the_rightsizing_rule_decides_the_advised_request() -> None:
    # Peak 16 GiB -> 20 GiB with headroom = 250 milli of an 80 GiB GPU; busy 10% x 2 = 200: a tenth up, 300.
    assert advised_milli(_job(0.10, 0.20)) == 300
    assert advised_milli(_job(0.40, 0.20)) is None  # busy at least 30%
    assert advised_milli(_job(0.10, 0.60)) is None  # peak memory at least half
    assert advised_milli(_job(0.10, 0.20, work=20 * 60)) is None  # under 30 minutes of telemetry
    assert advised_milli(_job(0.10, 0.20, gpus=8, members=2)) is None  # data-parallel: every GPU busy at peak


def test_followers_resubmit_smaller_and_keep_their_gpu_work(organisation: Organisation) -> None:
    assert rightsize(organisation, 0, seed=3) == organisation
    everyone = rightsize(organisation, 100, seed=3)
    advised = [j for j in organisation.jobs if advised_milli(j) is not None]
    assert followed(organisation, everyone) == len(advised) > 0
    for before, after in zip(organisation.jobs, everyone.jobs, strict=True):
        if before.milli != after.milli:
            assert after.milli < before.milli
            assert after.milli * after.busy_fraction == pytest.approx(before.milli * before.busy_fraction)


def test_utilisation_drives_no_decision_and_is_reported(organisation: Organisation) -> None:
    runs = {}
    for name, jobs in (
        ("modelled", organisation.jobs),
        ("always-busy", tuple(dataclasses.replace(j, busy_fraction=1.0) for j in organisation.jobs)),
    ):
        sim = OrgSim(dataclasses.replace(organisation, jobs=jobs), REGIMES["gpupool"], GPUS, DAYS * DAY)
        sim.run()
        runs[name] = sim
    starts = {k: {j: r.first_start for j, r in s.records.items()} for k, s in runs.items()}
    assert starts["modelled"] == starts["always-busy"]
    m = metrics(runs["modelled"])
    assert 0 < m["busy_gpu_pct"] < m["gpu_allocation_pct"]
    assert m["busy_gpu_pct"] < metrics(runs["always-busy"])["busy_gpu_pct"]
    ran = {r.job.kind for r in runs["modelled"].records.values() if r.first_start is not None}
    assert set(m["busy_by_class"]) == ran
    assert sum(c["busy_gpu_pct"] for c in m["busy_by_class"].values()) == pytest.approx(m["busy_gpu_pct"], abs=0.05)


def test_cli_runs_the_rightsized_regime_when_asked(tmp_path: Path) -> None:
    args = ["simulate", "org", "--trace", str(PHILLY), "--gpus", "16", "--days", "0.25", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, [*args, "--rightsizing-followers", "100"])
    assert result.exit_code == 0, result.output
    regimes = json.loads((tmp_path / "summary.json").read_text())["regimes"]
    assert list(regimes) == ["manual", "quota", "gpupool", "rightsized"]
    assert all("busy_gpu_pct" in m for m in regimes.values())
    assert regimes["rightsized"]["rightsizing_followers_pct"] == 100
    assert "rightsized:" in result.output and "% busy" in result.output


def test_cli_refuses_a_followers_share_out_of_range(tmp_path: Path) -> None:
    args = ["simulate", "org", "--trace", str(PHILLY), "--out", str(tmp_path), "--rightsizing-followers", "101"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "--rightsizing-followers" in result.output
