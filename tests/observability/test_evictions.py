"""The issue's proof: a scripted run with an idle stop, a max-runtime stop, a reclaim and a preemption, on the
real store, scheduler loop, local backend and API; /metrics counts each once under its reason code, and the
structured log has one line for each, carrying the id of the cycle that decided it."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from gpupool.lifecycle.phases import Phase
from tests.observability.harness import cluster

CONTROL_STEPS = ("reconcile", "telemetry", "policies", "snapshot", "schedule", "persist", "commit", "act",
                 "commit_events", "estimates")  # fmt: skip
CORE_STEPS = ("open", "stale_gangs", "allocate", "reclaim", "preempt", "explain")


def _samples(text: str, name: str) -> dict[str, float]:
    """{label set: value} for every sample of `name`."""
    out = {}
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}(\{{.*\}})? (\S+)", line)
        if m:
            out[m.group(1) or ""] = float(m.group(2))
    return out


def test_each_kind_of_stop_is_counted_once_under_its_reason(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpupool.control")
    with cluster(tmp_path) as c:
        for name, deserved in (("ops", 2), ("vision", 1), ("nlp", 1)):
            r = c.http("POST", "/api/v1/projects", {"name": name, "deserved_gpus": deserved})
            assert r.status_code == 201, r.text
        policy = {"idle_timeout_s": {"batch": 300}, "max_runtime_s": {"training": 900}}
        assert c.http("PATCH", "/api/v1/queues/ops/policy", policy).status_code == 200

        # Policies: an idle batch job and an overlong training job in ops.
        c.submit("ops", "idler", "batch", "batch")
        c.submit("ops", "overrun", "training", "training")
        c.until(lambda: c.row("idler").idle_since is not None and c.row("overrun").state == Phase.RUNNING, "running")
        c.cycle(advance=301)  # idle for longer than 300 s, running for less than 900 s
        c.until(lambda: c.states()["idler"] == Phase.FAILED, "the idle stop")
        assert c.states()["overrun"] == Phase.RUNNING
        c.cycle(advance=900)
        c.until(lambda: c.states()["overrun"] == Phase.FAILED, "the max-runtime stop")

        # Preemption: vision fills every GPU with batch jobs; a training job of its own takes one of them.
        for i in range(4):
            c.submit("vision", f"b{i}", "batch", "batch")
        c.until(lambda: all(c.states()[f"b{i}"] == Phase.RUNNING for i in range(4)), "vision's batch jobs")
        c.submit("vision", "urgent", "training", "training")
        c.until(lambda: c.states()["urgent"] == Phase.RUNNING, "the preemption")
        assert [c.states()[f"b{i}"] for i in range(4)] == [Phase.PREEMPTED] + [Phase.RUNNING] * 3

        # Reclaim: nlp, owed its deserved GPU, takes one back from vision, which borrows beyond its share.
        c.submit("nlp", "n0", "batch", "batch")
        c.until(lambda: c.states()["n0"] == Phase.RUNNING, "the reclaim")
        assert [c.states()[f"b{i}"] for i in range(4)] == [Phase.PREEMPTED] * 2 + [Phase.RUNNING] * 2
        assert c.states()["urgent"] == Phase.RUNNING

        text = c.http("GET", "/metrics").text
        assert _samples(text, "gpupool_evictions_total") == {
            '{reason="burst-budget"}': 0,
            '{reason="cluster-lost"}': 0, '{reason="consolidate"}': 0, '{reason="gang-broken"}': 0,
            '{reason="idle"}': 1, '{reason="max-runtime"}': 1, '{reason="node-lost"}': 0, '{reason="preempt"}': 1,
            '{reason="reclaim"}': 1,
        }  # fmt: skip

        # Every step of every cycle was timed (a telemetry sample was due in each: they are a second apart).
        counts = _samples(text, "gpupool_scheduler_step_seconds_count")
        cycles = c.controller.cycles
        assert counts == {f'{{step="{step}"}}': cycles for step in (*CONTROL_STEPS, *CORE_STEPS)}
        assert _samples(text, "gpupool_scheduler_cycles") == {"": cycles}
        node = c.controller.backend.inventory()[0].name

        # A member of nlp sees nlp's series only: none of these stops was nlp's (the reclaim took vision's).
        made = c.http("POST", "/api/v1/users", {"name": "nia", "role": "member", "projects": ["nlp"]}).json()
        mine = c.http("GET", "/metrics", token=made["token"]).text
        assert set(_samples(mine, "gpupool_evictions_total").values()) == {0}
        assert _samples(mine, "gpupool_project_allocated_gpus") == {'{project="nlp"}': 1}
        assert _samples(mine, "gpupool_scheduler_step_seconds_count") == counts

    evictions = [r for r in caplog.records if getattr(r, "event", None) == "eviction"]
    assert [(r.workload, r.project, r.reason) for r in evictions] == [
        ("idler", "ops", "idle"), ("overrun", "ops", "max-runtime"), ("b0", "vision", "preempt"),
        ("b1", "vision", "reclaim"),
    ]  # fmt: skip
    assert len({r.cycle_id for r in evictions}) == 4
    binds = [r for r in caplog.records if getattr(r, "event", None) == "bind"]
    assert [r.workload for r in binds] == ["idler", "overrun", "b0", "b1", "b2", "b3", "urgent", "n0"]
    assert all(r.nodes == [node] and r.cycle_id >= 1 for r in binds)
