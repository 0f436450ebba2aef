"""The caches kept between cycles never change a decision and do not grow for good."""

import dataclasses

import pytest

from gpupool.core import schedule
from gpupool.core.placement import memo as memo_module
from gpupool.core.placement.memo import Memo
from gpupool.sim.apply import apply_decision
from tests.core.builders import Cluster


def test_a_long_lived_memo_stays_bounded_and_decides_as_a_fresh_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memo_module, "MAX_TABLES", 6)
    c = Cluster().pool("h100", nodes=4, gpus=8).project("a", deserved=32)
    snapshot = c.snapshot()
    kept = Memo()
    for i in range(12):  # each cycle a new share size, so the typical mix and its tables change each time
        c.now = snapshot.now
        c.submit(f"w{i}", "a", gpu=0.05 + 0.07 * i)
        snapshot = dataclasses.replace(snapshot, workloads=(*snapshot.workloads, c.workloads[-1]))
        decision = schedule(snapshot, memo=kept)
        assert decision.to_dict() == schedule(snapshot).to_dict()
        assert kept.size()[0] <= 6 + 3  # bounded at the start of a cycle; a cycle adds one mix's tables
        snapshot = apply_decision(snapshot, decision, snapshot.now + 1)
    assert len([w for w in snapshot.workloads if w.placements]) == 12
