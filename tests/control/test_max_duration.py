"""A workload's declared max_duration is enforced: the real app and scheduler over SQLite, a real process (sleep)
on a simulated GPU, the loop's clock moved by the test. Past its max duration it is asked to stop once, with the
reason and both times in its events, and it ends failed, as the runtime policy ends work."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.lifecycle.events import EventCode
from gpupool.lifecycle.phases import StopReason
from tests.observability.harness import Cluster, cluster


@pytest.fixture
def c(tmp_path: Path) -> Iterator[Cluster]:
    with cluster(tmp_path) as c:
        yield c


def test_a_workload_past_its_max_duration_is_stopped_once_with_the_reason(c: Cluster) -> None:
    r = c.http("POST", "/api/v1/projects", {"name": "vision", "deserved_gpus": 4})
    assert r.status_code == 201, r.text
    body = {"project": "vision", "name": "long", "gpus": 1, "grace_s": 1, "max_duration_s": 60,
            "command": ["sleep", "600"]}  # fmt: skip
    r = c.http("POST", "/api/v1/workloads", body)
    assert r.status_code == 201, r.text
    assert r.json()["max_duration_s"] == 60
    c.until(lambda: c.states()["long"] == "running", "long to run")
    started = c.row("long").started_at
    assert started is not None
    c.cycle(advance=30.0)
    assert c.states()["long"] == "running"  # within its max duration
    c.cycle(advance=started + 61.0 - c.clock.now)
    c.until(lambda: c.states()["long"] == "failed", "long to be stopped")
    c.cycle(advance=5.0)

    d = c.http("GET", "/api/v1/workloads/long?project=vision").json()
    stops = [e for e in d["events"] if e["code"] == EventCode.STOP_REQUESTED]
    assert [(e["reason_code"], e["args"]) for e in stops] == [
        (StopReason.MAX_RUNTIME, {"ran_s": 61.0, "limit_s": 60.0, "declared": True})
    ]
    assert stops[0]["reason"] == "ran for 1m1s (its max duration 1m); stopping"
    assert [e["code"] for e in d["events"]][-1] == EventCode.FAILED
    assert d["events"][-1]["reason"] == "stopped by policy: ran for 1m1s (its max duration 1m)"
