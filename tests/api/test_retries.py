"""Retries end to end in-process: the real app and scheduler over SQLite, real processes on simulated GPUs, the
loop driven by hand on a clock the test moves (backoffs are the test's seconds)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from gpupool.lifecycle.transitions import backoff_s
from gpupool.models.attempts import RetryPolicy
from gpupool.store.tables import WorkloadRow
from tests.observability.harness import Cluster, cluster


@pytest.fixture
def c(tmp_path: Path) -> Iterator[Cluster]:
    with cluster(tmp_path) as c:
        assert c.http("POST", "/api/v1/projects", {"name": "vision", "deserved_gpus": 4}).status_code == 201
        yield c


def _ok(c: Cluster, method: str, path: str, body: Any = None, status: int = 200) -> Any:
    r = c.http(method, path, body)
    assert r.status_code == status, r.text
    return r.json()


def _row(c: Cluster, name: str) -> WorkloadRow:
    with c.api.ctx.sessions() as s:
        rows = list(s.scalars(select(WorkloadRow).where(WorkloadRow.name == name).order_by(WorkloadRow.id)))
        return rows[-1]


def _submit(c: Cluster, name: str, command: list[str], retry: Any, workers: int = 1) -> None:
    body = {"project": "vision", "name": name, "gpus": 1, "workers": workers, "grace_s": 1, "command": command,
            "retry": retry}  # fmt: skip
    _ok(c, "POST", "/api/v1/workloads", body, 201)


def test_a_job_failing_every_time_is_retried_after_doubling_backoffs_then_fails_with_three_attempts(
    c: Cluster,
) -> None:
    _submit(c, "flaky", ["sh", "-c", "exit 3"], {"on": "on-failure", "max_retries": 2, "backoff_s": 10})
    c.until(lambda: _row(c, "flaky").reason_event == "retrying", "the first retry")
    row = _row(c, "flaky")
    decided = row.retry_at
    assert (row.state, row.hold, row.attempt) == ("pending", True, 1)
    assert decided is not None
    c.cycle(advance=decided - c.clock.now - 0.5)  # not yet
    assert (_row(c, "flaky").hold, _row(c, "flaky").state) == (True, "pending")
    c.until(lambda: _row(c, "flaky").attempt == 2, "the second retry")
    assert _row(c, "flaky").retry_at == pytest.approx(c.clock.now + 20, abs=1.0)
    c.until(lambda: _row(c, "flaky").state == "failed", "the last attempt to fail")

    d = _ok(c, "GET", "/api/v1/workloads/flaky?project=vision")
    assert (d["state"], d["exit_code"], d["attempt"]) == ("failed", 3, 2)
    shown = [(a["number"], a["outcome"], a["reason"], a["exit_code"], a["retried"]) for a in d["attempts"]]
    assert shown == [(n, "failed", "failed", 3, n < 3) for n in (1, 2, 3)]
    assert all(a["started"] is not None and a["ended"] >= a["started"] for a in d["attempts"])
    retrying = [e for e in d["events"] if e["code"] == "retrying"]
    assert [(e["reason_code"], e["args"]) for e in retrying] == [
        ("failed", {"member": 0, "exit_code": 3, "attempt": 2, "retry": 1, "max_retries": 2, "backoff_s": 10.0}),
        ("failed", {"member": 0, "exit_code": 3, "attempt": 3, "retry": 2, "max_retries": 2, "backoff_s": 20.0}),
    ]
    assert retrying[0]["reason"] == "member 0 exited with code 3; retry 1 of 2 (attempt 2) in 10s"
    assert d["events"][-1]["code"] == "failed"
    assert d["reason"] == "member 0 exited with code 3; no retries left (it had 2)"


def test_a_gang_with_one_failing_member_is_retried_whole(c: Cluster) -> None:
    # Rank 0 fails at its first attempt only (its marker is in the shared working directory); rank 1 runs on.
    script = 'if [ "$RANK" = 0 ] && [ ! -e tried ]; then touch tried; exit 1; fi; sleep 600'
    _submit(c, "gang", ["sh", "-c", script], "on-failure", workers=2)
    c.until(lambda: _row(c, "gang").state == "running" and _row(c, "gang").attempt == 1, "the gang's retry to run")
    row = _row(c, "gang")
    by_attempt = sorted((a.attempt, a.member, a.state) for a in row.allocations)
    assert by_attempt == [(0, 0, "ended"), (0, 1, "ended"), (1, 0, "ready"), (1, 1, "ready")]
    assert [(a["number"], a["outcome"], a["retried"]) for a in row.attempts] == [(1, "failed", True)]


def test_a_cancel_is_never_retried_and_a_cancel_during_the_backoff_ends_the_workload(c: Cluster) -> None:
    _submit(c, "sleepy", ["sleep", "600"], "always")
    c.until(lambda: _row(c, "sleepy").state == "running", "it to run")
    _ok(c, "POST", "/api/v1/workloads/sleepy/cancel?project=vision")
    c.until(lambda: _row(c, "sleepy").state == "cancelled", "it to end")
    assert [a["outcome"] for a in _row(c, "sleepy").attempts] == ["cancelled"]

    _submit(c, "fails", ["false"], {"on": "on-failure", "backoff_s": 600})
    c.until(lambda: _row(c, "fails").reason_event == "retrying", "its retry")
    _ok(c, "POST", "/api/v1/workloads/fails/cancel?project=vision")
    row = _row(c, "fails")
    assert (row.state, row.hold, row.retry_at, row.live_name) == ("cancelled", False, None, None)
    c.cycle(advance=700)
    assert _row(c, "fails").state == "cancelled"


@pytest.mark.parametrize(
    ("given", "policy"),
    [
        ("on-preemption", RetryPolicy(on="on-preemption")),
        ({"on": "always", "max-retries": 5, "backoff": 1}, RetryPolicy(on="always", max_retries=5, backoff_s=1)),
        ({"max_retries": 0}, RetryPolicy(max_retries=0)),
    ],
)
def test_the_yaml_shapes_of_a_retry_policy(given: Any, policy: RetryPolicy) -> None:
    assert RetryPolicy.model_validate(given) == policy


@pytest.mark.parametrize(
    ("retry", "where", "message"),
    [
        ({"max_retries": 21}, "max_retries", "Input should be less than or equal to 20"),
        ("sometimes", "on", "Input should be 'on-failure', 'on-preemption' or 'always'"),
        ({"backoff_s": -1}, "backoff_s", "Input should be greater than or equal to 0"),
    ],
)
def test_a_retry_policy_out_of_bounds_is_a_422(c: Cluster, retry: Any, where: str, message: str) -> None:
    body = {"project": "vision", "name": "x", "gpus": 1, "command": ["true"], "retry": retry}
    r = c.http("POST", "/api/v1/workloads", body)
    assert r.status_code == 422, r.text
    assert [(e["loc"][-1], e["msg"]) for e in r.json()["detail"]] == [(where, message)]


def test_backoffs_double_up_to_their_cap() -> None:
    assert [backoff_s(10, n) for n in (1, 2, 3, 7, 30)] == [10.0, 20.0, 40.0, 640.0, 900.0]
