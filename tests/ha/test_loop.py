"""The scheduler loop when its cycles fail (the store down): it waits longer after each failure, up to a
ceiling, logs the outage once and its end once, and runs at its usual pace again after one cycle succeeds."""

from __future__ import annotations

import itertools
import logging
import time

import pytest

from gpupool.control.loop import BACKOFF_MAX_S, SchedulerLoop
from tests.e2e.conftest import wait_for


def test_failing_cycles_back_off_and_the_outage_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    attempts: list[float] = []

    def cycle() -> bool:
        attempts.append(time.monotonic())
        if len(attempts) <= 4:
            raise RuntimeError("the store is down")
        return False

    loop = SchedulerLoop(cycle, lambda: 0.0, interval_s=0.05)
    caplog.set_level(logging.INFO, logger="gpupool.control")
    loop.start()
    try:
        wait_for(lambda: len(attempts) >= 2 and loop.health().failing_since is not None, 10, "a failure")
        wait_for(lambda: len(attempts) >= 6, 10, "cycles to succeed again")
        health = loop.health()
    finally:
        loop.stop()
    gaps = [later - earlier for earlier, later in itertools.pairwise(attempts[:5])]
    assert [gap >= want for gap, want in zip(gaps, (0.05, 0.1, 0.2, 0.4), strict=True)] == [True] * 4
    assert (health.failing_since, health.leader, health.last_ok_at is not None) == (None, True, True)
    lines = [r.getMessage() for r in caplog.records if r.name == "gpupool.control"]
    assert [line.split(":")[0].split(" after ")[0] for line in lines] == [
        "scheduling cycles are failing",
        "scheduling cycles succeed again",
    ]


def test_the_wait_between_failures_stops_growing_at_its_ceiling() -> None:
    loop = SchedulerLoop(lambda: False, lambda: 0.0, interval_s=2.0)
    waits = [loop._failed() for _ in range(8)]
    assert waits == [2.0, 4.0, 8.0, BACKOFF_MAX_S, BACKOFF_MAX_S, BACKOFF_MAX_S, BACKOFF_MAX_S, BACKOFF_MAX_S]
