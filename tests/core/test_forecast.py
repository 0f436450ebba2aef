"""Start-time estimates: the core run forward over the expected ends of running work."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core import PendingCode, State, schedule
from gpupool.core.forecast import Estimate, Forecast, Limits, forecast, runtimes_for
from gpupool.core.runtime_model import UNKNOWN, Basis, Runtime, RuntimeModel
from gpupool.sim.apply import apply_decision
from tests.core.builders import Cluster
from tests.core.test_properties import SETTINGS, Scenario, arrive, scenario_st, shuffled

HOUR = 3600.0


def one_node() -> Cluster:
    return Cluster().pool("p", nodes=1, gpus=4).project("a", deserved=4).project("b", deserved=0)


def test_a_workload_starts_when_the_work_in_its_way_ends() -> None:
    c = one_node().running("r1", "a", "p-0", [0, 1]).running("r2", "a", "p-0", [2, 3])
    c.submit("w", "a", gpus=2)
    snap = c.snapshot()
    runtimes = {"r1": Runtime(2 * HOUR, Basis.DECLARED), "r2": Runtime(5 * HOUR, Basis.HISTORY)}
    out = forecast(snap, runtimes)
    # r1 started two seconds before `w` was submitted, so it ends 2 h after that.
    assert out == {"w": Estimate("w", snap.now - 2 + 2 * HOUR, Basis.DECLARED)}


def test_queued_work_waits_for_the_work_started_before_it_and_takes_the_weakest_basis() -> None:
    c = one_node().running("r1", "a", "p-0", [0, 1, 2, 3])
    c.submit("w1", "a", gpus=4).submit("w2", "a", gpus=4)
    snap = c.snapshot()
    start = snap.now - 2
    runtimes = {"r1": Runtime(HOUR, Basis.DECLARED), "w1": Runtime(3 * HOUR, Basis.HISTORY)}
    out = forecast(snap, runtimes)
    assert out["w1"] == Estimate("w1", start + HOUR, Basis.DECLARED)
    assert out["w2"] == Estimate("w2", start + 4 * HOUR, Basis.HISTORY)


def test_work_that_is_not_expected_to_end_leaves_a_reason_instead_of_a_time() -> None:
    c = Cluster().pool("p", nodes=1, gpus=4).project("a", deserved=8)
    c.running("svc", "a", "p-0", [0, 1, 2, 3], priority="production").submit("w", "a", gpus=1)
    out = forecast(c.snapshot(), {"svc": UNKNOWN})
    assert out["w"].start is None and out["w"].basis is Basis.NONE and not out["w"].beyond
    assert out["w"].code is PendingCode.NO_NODE_FITS


def test_work_that_never_fits_gets_no_time() -> None:
    c = one_node().submit("big", "a", gpus=8)
    out = forecast(c.snapshot(), {})
    assert out["big"].start is None and out["big"].code is PendingCode.NEVER_FITS


def test_free_room_means_now() -> None:
    c = one_node().submit("w", "a", gpus=1)
    snap = c.snapshot()
    assert forecast(snap, {}) == {"w": Estimate("w", snap.now, Basis.DECLARED)}


def test_minimum_runtime_is_respected_before_a_preemption() -> None:
    """A production workload preempts its project's batch work once that has run its minimum runtime."""
    c = one_node().running("low", "a", "p-0", [0, 1, 2, 3], priority="batch", min_runtime=1800.0)
    c.submit("w", "a", gpus=4, priority="production")
    snap = c.snapshot()
    out = forecast(snap, {"low": Runtime(10 * HOUR, Basis.HISTORY)}, limits=Limits(resolution=0.0))
    # Evicted at the step the minimum runtime ends, and bound in the same step's next round.
    assert out["w"] == Estimate("w", snap.now - 1 + 1800.0, Basis.DECLARED)


def test_the_step_budget_bounds_the_cost_and_says_so() -> None:
    c = one_node().running("r1", "a", "p-0", [0, 1, 2, 3])
    for i in range(5):
        c.submit(f"w{i}", "a", gpus=4)
    runtimes = {w.id: Runtime(HOUR, Basis.DECLARED) for w in c.snapshot().workloads}
    f = Forecast(c.snapshot(), runtimes, limits=Limits(max_steps=3))
    while f.step():
        pass
    assert f.steps == 3 and f.done
    out = f.estimates()
    assert [out[f"w{i}"].start is not None for i in range(5)] == [True, True, False, False, False]
    assert out["w2"].beyond


def test_a_forecast_is_the_same_however_its_steps_are_spread() -> None:
    c = one_node().running("r1", "a", "p-0", [0, 1]).running("r2", "b", "p-0", [2, 3])
    for i in range(4):
        c.submit(f"w{i}", "a" if i % 2 else "b", gpus=2)
    snap = c.snapshot()
    runtimes = {w.id: Runtime(HOUR * (1 + i), Basis.HISTORY) for i, w in enumerate(snap.workloads)}
    whole = forecast(snap, runtimes)
    f = Forecast(snap, runtimes)
    while f.step():
        assert f.estimates() != whole
    assert f.estimates() == whole and forecast(snap, runtimes) == whole
    assert all(e.start is not None for e in whole.values())


def test_runtime_model_uses_quantiles_with_a_fallback_and_ages_running_work() -> None:
    m = RuntimeModel(window=8, quantile=0.5, min_samples=3)
    assert m.predict("a", "training") is None
    for r in (100.0, 200.0, 300.0):
        m.observe("a", "training", r)
    m.observe("b", "training", 5000.0)
    assert m.predict("a", "training") == 200.0
    assert m.predict("b", "training") == 300.0  # b has one runtime: the type's across projects
    assert m.predict("a", "training", elapsed_s=250.0) == 5000.0  # outran a's: the type's longer ones
    assert m.predict("a", "training", elapsed_s=6000.0) == 12000.0  # outran everything seen: as long again
    assert m.predict("a", "batch") == 300.0  # nothing of the type: everything
    assert m.expect("a", "training", declared_s=150.0) == Runtime(150.0, Basis.DECLARED)
    assert m.expect("a", "training", declared_s=3600.0) == Runtime(200.0, Basis.HISTORY)
    assert RuntimeModel().expect("a", "training", None) is UNKNOWN


def test_runtimes_for_a_snapshot_cap_history_by_the_declared_duration() -> None:
    c = one_node().running("r1", "a", "p-0", [0, 1]).submit("w", "a", gpus=2)
    snap = c.snapshot()
    m = RuntimeModel(min_samples=1)
    m.observe("a", "training", HOUR)
    out = runtimes_for(snap, m, {"w": 600.0})
    assert out == {"r1": Runtime(HOUR, Basis.HISTORY), "w": Runtime(600.0, Basis.DECLARED)}


def test_limits_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="max_steps"):
        Limits(max_steps=0)


@settings(SETTINGS, max_examples=60)
@given(scenario_st(max_steps=2), st.randoms(use_true_random=False))
def test_every_pending_workload_gets_an_estimate_and_the_first_step_is_the_live_decision(
    scenario: Scenario, rng: random.Random
) -> None:
    snapshot = scenario.snapshot
    for step in scenario.steps:  # a few live cycles first, so that work runs
        snapshot = arrive(snapshot, step)
        snapshot = apply_decision(snapshot, schedule(snapshot, scenario.config), snapshot.now + step.advance)
    runtimes = {
        w.id: Runtime(rng.choice((None, 30.0, 120.0, 900.0)), rng.choice((Basis.DECLARED, Basis.HISTORY)))
        for w in snapshot.workloads
    }
    out = forecast(snapshot, runtimes, scenario.config)
    pending = {w.id for w in snapshot.workloads if w.state is State.PENDING}
    assert set(out) == pending
    assert all(e.start is None or e.start >= snapshot.now for e in out.values())
    assert all((e.start is None) == (e.basis is Basis.NONE) for e in out.values())
    now = {b.workload for b in schedule(snapshot, scenario.config).binds}
    assert now <= {wid for wid, e in out.items() if e.start == snapshot.now}
    assert forecast(shuffled(snapshot, rng), runtimes, scenario.config) == out
