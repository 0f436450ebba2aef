"""Start-time estimates in the organisation simulation: they observe only, and they are measured."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from gpupool.sim.org import REGIMES, OrgSim
from gpupool.sim.org_jobs import DAY, MAX_DECLARED_S, ROUND_DURATIONS, Organisation, build
from gpupool.sim.org_report import metrics
from gpupool.sim.traces import load_philly
from tests.sim.conftest import PHILLY

GPUS, DAYS = 48, 0.75


@pytest.fixture(scope="module")
def organisation() -> Organisation:
    return build(load_philly(PHILLY), gpus=GPUS, days=DAYS, seed=3)


@pytest.fixture(scope="module")
def estimated(organisation: Organisation) -> OrgSim:
    sim = OrgSim(organisation, REGIMES["gpupool"], GPUS, DAYS * DAY)
    sim.run()
    return sim


def test_estimates_change_nothing_else(organisation: Organisation, estimated: OrgSim) -> None:
    plain = OrgSim(organisation, dataclasses.replace(REGIMES["gpupool"], estimates=False), GPUS, DAYS * DAY)
    plain.run()
    assert plain.estimator is None and estimated.estimator is not None
    assert estimated.totals == plain.totals

    def outcome(sim: OrgSim) -> list[tuple[float | None, float | None, int, int]]:
        return [(r.first_start, r.finish, r.preemptions, r.suspensions) for r in sim.records.values()]

    assert outcome(estimated) == outcome(plain)
    with_eta, without = metrics(estimated), metrics(plain)
    assert {k: v for k, v in with_eta.items() if not k.startswith("eta") and k != "per_class"} == {
        k: v for k, v in without.items() if k != "per_class"
    }


def test_every_waiting_job_gets_an_estimate_and_history_beats_declared_durations(estimated: OrgSim) -> None:
    m = metrics(estimated)
    assert estimated.estimator is not None
    waited = [r for r in estimated.records.values() if r.first_start is not None and r.first_start > r.job.submit]
    made = estimated.estimator.made["history"]
    assert all(r.job.id in made for r in waited if r.first_start - r.job.submit > estimated.interval)
    history, declared = m["eta_by_predictor"]["history"], m["eta_by_predictor"]["declared"]
    assert m["eta_jobs"] == history["eta_jobs"] == declared["eta_jobs"] > 50
    assert m["eta_within_2x_pct"] == history["eta_within_2x_pct"] >= 70.0
    assert declared["eta_within_2x_pct"] < history["eta_within_2x_pct"]
    assert history["eta_refreshed_within_2x_pct"] >= history["eta_within_2x_pct"]
    assert m["per_class"]["training"]["eta_jobs"] == history["per_class"]["training"]["eta_jobs"]
    assert m["eta_forecasts"] > 0 and m["eta_forecast_cycles"] >= m["eta_forecasts"]


def test_declared_durations_look_like_users_own(organisation: Organisation) -> None:
    """Modal: a few round values, the maximum the most popular; above the runtime, never a multiple of it."""
    declared = [j for j in organisation.jobs if j.declared is not None]
    assert {j.kind for j in declared} == {"training", "batch", "notebook"}
    assert all(j.declared is None for j in organisation.jobs if j.kind == "inference")
    popular = Counter(j.declared for j in declared).most_common()
    assert popular[0][0] == MAX_DECLARED_S
    assert sum(1 for j in declared if j.declared in ROUND_DURATIONS) >= 0.9 * len(declared)
    # Tsafrir (JSSPP 2010): about 90% of jobs use some 20 values.
    assert sum(n for _, n in popular[:20]) >= 0.9 * len(declared)
    assert all(j.declared > j.work and not (j.declared / j.work).is_integer() for j in declared)
