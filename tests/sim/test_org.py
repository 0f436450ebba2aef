import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool.cli.main import app
from gpupool.core import MILLI, Decision, SchedulerConfig, Snapshot, State, schedule
from gpupool.core.placement.memo import Memo
from gpupool.sim import org
from gpupool.sim.org import REGIMES, OrgSim
from gpupool.sim.org_jobs import DAY, Organisation, build
from gpupool.sim.org_report import metrics
from gpupool.sim.traces import load_philly
from tests.sim.conftest import PHILLY


@pytest.fixture(scope="module")
def organisation() -> Organisation:
    return build(load_philly(PHILLY), gpus=64, days=1, seed=3)


class Nominations:
    """Watches each decision of a run: a pending job that evictions were made for (nominated nodes) must see the
    same nodes in the next snapshot, as the control plane carries them."""

    def __init__(self) -> None:
        self.nominated: dict[str, set[str]] = {}
        self.carried: list[bool] = []

    def schedule(self, snapshot: Snapshot, config: SchedulerConfig, memo: Memo | None = None) -> Decision:
        for w in snapshot.workloads:
            if w.id in self.nominated and w.state is State.PENDING:
                self.carried.append(set(w.nominated_nodes) == self.nominated.pop(w.id))
        decision = schedule(snapshot, config, memo=memo)
        self.nominated.update({p.workload: {x.node for x in p.nominated} for p in decision.pending if p.nominated})
        return decision


@pytest.fixture(scope="module")
def nominations() -> Nominations:
    return Nominations()


@pytest.fixture(scope="module")
def runs(organisation: Organisation, nominations: Nominations) -> dict[str, OrgSim]:
    out = {}
    for name, regime in REGIMES.items():
        # Estimates only observe (tests/sim/test_org_eta.py proves it) and cost more than the run: left out here.
        sim = OrgSim(organisation, dataclasses.replace(regime, estimates=False), 64, DAY)
        with pytest.MonkeyPatch.context() as patch:
            if name == "gpupool":  # the nomination test's watch rides on this run rather than a run of its own
                patch.setattr(org, "schedule", nominations.schedule)
            sim.run()
        out[name] = sim
    return out


def test_the_organisation_has_fifteen_teams_in_five_departments(organisation: Organisation) -> None:
    assert len(organisation.departments) == 5
    assert sum(len(p) for p in organisation.departments.values()) == 15
    assert sum(organisation.deserved_gpus.values()) <= 64
    kinds = {j.kind for j in organisation.jobs}
    assert kinds == {"training", "batch", "notebook", "inference"}
    assert organisation == build(load_philly(PHILLY), gpus=64, days=1, seed=3)


def test_no_regime_ever_overcommits_a_gpu(runs: dict[str, OrgSim]) -> None:
    for sim in runs.values():
        assert all(a <= sim.gpus * MILLI for _, a, _ in sim.totals.timeline)
        assert all(0 <= b <= a for _, a, b in sim.totals.timeline)


def test_pooling_beats_manual_allocation(runs: dict[str, OrgSim]) -> None:
    manual, pooled = metrics(runs["manual"]), metrics(runs["gpupool"])
    assert pooled["gpu_allocation_pct_while_waiting"] > manual["gpu_allocation_pct_while_waiting"]
    assert pooled["wait_p95_s"] < manual["wait_p95_s"]
    assert pooled["mean_jct_s"] < manual["mean_jct_s"]


def test_only_gpupool_shares_gpus_and_reclaims_idle_notebooks(runs: dict[str, OrgSim]) -> None:
    assert metrics(runs["gpupool"])["notebook_suspensions"] > 0
    assert metrics(runs["quota"])["notebook_suspensions"] == 0
    fractional = {
        d.milli
        for r in runs["gpupool"].records.values()
        if r.job.kind == "notebook"
        for p in r.placements
        for d in p.devices
    }
    assert all(m < MILLI for m in fractional)
    manual = metrics(runs["manual"])
    assert manual["preemptions_per_100_jobs"] == 0


def test_cli_writes_every_regime(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "org",
            "--trace",
            str(PHILLY),
            "--gpus",
            "16",
            "--days",
            "0.25",
            "--estimates",
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    for regime in ("manual", "quota", "gpupool"):
        m = summary["regimes"][regime]
        for key in (
            "gpu_allocation_pct_while_waiting",
            "busy_share_of_allocated_pct",
            "wait_p50_s",
            "wait_p95_s",
            "mean_jct_s",
            "preemptions_per_100_jobs",
            "per_class",
            "per_project",
        ):
            assert key in m
    assert "eta_within_2x_pct" in summary["regimes"]["gpupool"]
    assert "eta_within_2x_pct" not in summary["regimes"]["quota"]
    assert (tmp_path / "utilisation.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_measures_estimates_only_when_asked(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["simulate", "org", "--trace", str(PHILLY), "--gpus", "16", "--days", "0.25", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert "eta_within_2x_pct" not in json.loads((tmp_path / "summary.json").read_text())["regimes"]["gpupool"]


@pytest.mark.parametrize(("args", "message"), [(["--gpus", "12"], "multiple of 8"), (["--days", "0"], "--days")])
def test_cli_refuses_bad_sizes(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["simulate", "org", "--trace", str(PHILLY), "--out", str(tmp_path), *args])
    assert result.exit_code == 2 and message in result.output


def test_no_project_waits_longer_than_a_tick_for_gpus_it_is_owed(runs: dict[str, OrgSim]) -> None:
    for name in ("quota", "gpupool"):
        assert metrics(runs[name])["owed_waits_over_one_interval"] == 0, name


def test_a_job_that_evictions_were_made_for_keeps_its_nomination(
    runs: dict[str, OrgSim], nominations: Nominations
) -> None:
    """As the control plane does: the next decision sees the nodes made free for it, so it claims them first."""
    assert nominations.carried and all(nominations.carried)
