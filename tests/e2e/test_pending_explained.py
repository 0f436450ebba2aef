"""Pending work that says why and when, through the product: a real server with simulated GPUs, the real CLI's
`describe` (text and `-o json`) naming the real blocker with its numbers, the workload's place in its project's
queue and its estimated start; and, once it starts, the start event that records the estimate beside the wait."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from gpupool.cli.workloads import start_note
from gpupool.models.schemas import EventPublic
from tests.e2e.conftest import Server, wait_for
from tests.e2e.test_scheduling import SPIN

DAY = 86400.0
DECLARED = "declared: from declared max durations and minimum runtimes"


def described(s: Server, name: str) -> dict[str, str]:
    """The real CLI's `describe` text, its header lines by label ("Reason", "ETA", ...)."""
    out = s.cli("describe", name).stdout.split("\nEvents:\n")[0]
    return {label: text.strip() for label, _, text in (line.partition(":") for line in out.splitlines())}


def local(at: float) -> str:
    """A time as describe prints it: local time, to the second."""
    return datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S")


def test_work_over_its_projects_limit_says_so_with_its_eta_and_its_start_records_estimate_and_wait(
    make_server: Callable[..., Server],
) -> None:
    s = make_server("fake:2xH100-80GB")
    s.cli("project", "create", "vision", "--deserved-gpus", "1", "--limit-gpus", "1")
    s.cli("project", "create", "nlp", "--deserved-gpus", "1")
    # vision at its limit with a job that declared 25 hours; nlp fills the other GPU for longer. A day or more
    # ahead the CLI says the wait in days and hours, so the line reads the same however long the test runs.
    s.cli("submit", "-p", "vision", "--name", "hog", "--gpus", "1", "--max-duration", "25h", "--", *SPIN)
    s.cli("submit", "-p", "nlp", "--name", "filler", "--gpus", "1", "--max-duration", "2d", "--", *SPIN)
    hog = s.wait_state("hog", "running")
    s.wait_state("filler", "running")
    submitted = time.time()
    s.cli("submit", "-p", "vision", "--name", "waiter", "--gpus", "1", "--", *SPIN)
    s.cli("submit", "-p", "vision", "--name", "next", "--gpus", "1", "--", *SPIN)

    eta = hog["started_at"] + 25 * 3600
    before = wait_for(lambda: (w := s.workload("waiter"))["eta"] and w, 60, "waiter's estimate")
    # The node is full too, but a GPU freed there would not start it: its project's limit is the blocker.
    assert (before["state"], before["reason_code"]) == ("pending", "over-limit")
    args = {"queue": "vision", "level": "project", "pool": "default", "resource": "gpu"}
    assert before["reason_args"] == args | {"used": 1000, "quota": 1000, "asks": 1000}
    reason = "would put project vision over its limit in pool default: uses 1 of 1 GPU, asks 1 (1 over)"
    assert (before["reason"], before["reason_short"]) == (reason, "over limit: vision 1+1/1 GPUs in default")
    assert before["position"] == {"project": 1, "project_queued": 2}
    # Its estimated start is when the job at vision's limit reaches the duration it declared.
    shown = datetime.fromisoformat(before["eta"])
    assert (shown, before["eta_basis"]) == (datetime.fromtimestamp(eta, UTC), "declared")
    assert s.workload("next")["position"] == {"project": 2, "project_queued": 2}

    text = described(s, "waiter")
    assert (text["State"], text["Reason"]) == ("pending", f"{reason} [over-limit]")
    assert text["Numbers"] == "queue=vision level=project pool=default resource=gpu used=1000 quota=1000 asks=1000"
    assert text["Position"] == "1 of 2 in project vision's queue (by priority, then submit time)"
    assert text["ETA"] == f"{local(eta)}, in 1d ({DECLARED})"
    listed = {w["name"]: w for w in s.json("list", "-p", "vision")}
    assert (listed["waiter"]["eta"], listed["waiter"]["eta_basis"]) == (before["eta"], "declared")

    s.cli("cancel", "hog")  # the blocker goes
    after = s.wait_state("waiter", "running")
    assert after["devices"] == hog["devices"] and (after["eta"], after["eta_basis"]) == (None, None)
    events = s.workload("waiter")["events"]
    (placed,) = [e for e in events if e["code"] == "placed"]
    # Without a change to the queue, estimates are made again each minute; within one of the submits, none was
    # made again between the describe above and the start, so the start records the estimate shown there.
    assert placed["at"] - submitted < 60, "the test ran too slowly to know which estimate the start recorded"
    recorded = {k: placed["args"][k] for k in ("eta", "eta_basis", "estimated_wait_s", "waited_s")}
    queued_at = before["created_at"]  # submitted once, never requeued
    assert recorded == {
        "eta": eta,
        "eta_basis": "declared",
        "estimated_wait_s": round(eta - queued_at, 3),
        "waited_s": round(placed["at"] - queued_at, 3),
    }
    assert datetime.fromtimestamp(recorded["eta"], UTC) == shown
    assert placed["at"] <= after["started_at"]
    # describe's event log says both: under a minute waited, beside the day it was estimated at.
    log = s.cli("describe", "waiter").stdout.split("\nEvents:\n")[1].splitlines()
    (line,) = [x for x in log if "placed on" in x]
    waited = f"waited {int(recorded['waited_s'])}s, estimated 1d (declared)"
    assert line == f"  {local(placed['at'])}  {placed['state']:<10} {placed['reason']}; {waited}"
    # The one behind it is next, and still over vision's limit, now held by the waiter.
    following: dict[str, Any] = s.workload("next")
    assert (following["reason_code"], following["position"]) == ("over-limit", {"project": 1, "project_queued": 1})


def test_work_waiting_for_a_lower_priority_jobs_minimum_runtime_says_until_when(
    make_server: Callable[..., Server],
) -> None:
    # Training's minimum runtime at 25 hours: a day or more ahead the CLI says the wait in days and hours.
    s = make_server("fake:1xH100-80GB", "--min-runtime", "training=90000")
    s.cli("project", "create", "vision", "--deserved-gpus", "1")
    s.cli("submit", "-p", "vision", "--name", "train", "--gpus", "1", "--", *SPIN)
    train = s.wait_state("train", "running")
    s.cli("submit", "-p", "vision", "--name", "svc", "--priority", "production", "--gpus", "1", "--", *SPIN)

    until = train["started_at"] + 90000
    svc = wait_for(lambda: (w := s.workload("svc"))["eta"] and w, 60, "svc's estimate")
    # A GPU of its own project's preemptible training job would make room, once that job has run its minimum.
    assert (svc["state"], svc["reason_code"]) == ("pending", "min-runtime")
    # The core names a workload by its label, its name quoted (gpupool.store.snapshot), in arguments too.
    assert svc["reason_args"] == {"until": int(until), "victim": "'train'", "project": "vision", "gpu_milli": 1000}
    at = datetime.fromtimestamp(int(until), UTC).strftime("%Y-%m-%d %H:%M:%S")
    reason = (
        f"waiting for 'train' of project vision to pass its minimum runtime at {at} UTC; then its 1 GPU may be taken"
    )
    assert (svc["reason"], svc["reason_short"]) == (reason, f"min runtime of 'train' until {at[11:16]} UTC")
    assert svc["position"] == {"project": 1, "project_queued": 1}
    # It starts when the minimum runtime ends: nothing waits for an end of running work (basis "declared").
    assert (datetime.fromisoformat(svc["eta"]), svc["eta_basis"]) == (datetime.fromtimestamp(until, UTC), "declared")

    text = described(s, "svc")
    assert (text["State"], text["Reason"]) == ("pending", f"{reason} [min-runtime]")
    assert text["Numbers"] == f"until={int(until)} victim='train' project=vision gpu_milli=1000"
    assert text["Position"] == "1 of 1 in project vision's queue (by priority, then submit time)"
    assert text["ETA"] == f"{local(until)}, in 1d ({DECLARED})"


@pytest.mark.parametrize(
    ("args", "note"),
    [
        (
            {"nodes": ["n"], "eta": None, "eta_basis": None, "estimated_wait_s": None, "waited_s": 3.9},
            "; waited 3s, with no estimate",
        ),
        (
            {"nodes": ["n"], "eta": 9e8, "eta_basis": "history", "estimated_wait_s": 7300.0, "waited_s": 5400.5},
            "; waited 1h30m, estimated 2h1m (history)",
        ),
        ({"nodes": ["n"]}, ""),  # a start recorded before estimates existed
    ],
)
def test_describe_puts_a_starts_wait_beside_its_estimate_and_says_when_it_had_none(
    args: dict[str, Any], note: str
) -> None:
    event = EventPublic(at=0.0, state="pending", code="placed", args=args, reason="placed on n")
    assert start_note(event) == note
