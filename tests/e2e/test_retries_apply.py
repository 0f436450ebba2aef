"""Retries, names, rerun, delete and declarative apply against a real server (real processes on simulated
GPUs), on SQLite and PostgreSQL: the SDK for apply, `gpupool rerun` and `gpupool delete` as the CLI runs them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import typer
from typer.testing import CliRunner

from gpupool.cli import attempts
from gpupool.client.client import ApiError
from gpupool.models.attempts import RetryPolicy
from gpupool.models.schemas import ProjectCreate, WorkloadCreate
from tests.e2e.conftest import Server, wait_for

MakeServer = Callable[..., Server]


@pytest.fixture
def s(make_server: MakeServer) -> Server:
    s = make_server("fake:4xH100-80GB")
    s.client().create_project(ProjectCreate(name="vision", deserved_gpus=4))
    return s


def _cli(s: Server, monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str]:
    """Exit code and output; an API error as the CLI's main() prints it (it is raised through the commands)."""
    app = typer.Typer()
    attempts.register(app)
    for k, v in (s.env | {"GPUPOOL_URL": s.url, "GPUPOOL_TOKEN": s.admin_token}).items():
        monkeypatch.setenv(k, v)
    done = CliRunner().invoke(app, list(args))
    if isinstance(done.exception, ApiError):
        return 1, f"error: {done.exception.reason}\n"
    return done.exit_code, done.output


def test_a_job_failing_twice_more_is_failed_after_three_attempts(s: Server) -> None:
    body = WorkloadCreate(project="vision", name="flaky", gpus=1, command=["sh", "-c", "exit 7"],
                          retry=RetryPolicy(max_retries=2, backoff_s=0.2))  # fmt: skip
    s.client().submit(body)
    d = s.wait_state("flaky", "failed")
    assert (d["exit_code"], d["attempt"]) == (7, 2)
    assert [(a["number"], a["outcome"], a["exit_code"], a["retried"]) for a in d["attempts"]] == [
        (1, "failed", 7, True), (2, "failed", 7, True), (3, "failed", 7, False),
    ]  # fmt: skip
    retrying = [(e["args"]["attempt"], e["args"]["backoff_s"]) for e in d["events"] if e["code"] == "retrying"]
    assert retrying == [(2, 0.2), (3, 0.4)]
    assert d["reason"] == "member 0 exited with code 7; no retries left (it had 2)"


def test_delete_and_rerun_under_the_same_name(s: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    c = s.client()
    first = c.submit(WorkloadCreate(project="vision", name="once", gpus=1, command=["sh", "-c", "echo hi"]))
    s.wait_state("once", "succeeded")
    code, out = _cli(s, monkeypatch, "rerun", "once", "-p", "vision")
    second = c.describe("once", "vision")
    assert (code, out) == (0, f"workload once: pending (id {second.id}; a new run)\n")
    assert [h.id for h in second.history] == [first.id]
    s.wait_state("once", "succeeded")
    files = [s.data_dir / kind / str(w.id) for kind in ("workloads", "logs") for w in (first, second)]
    assert [p.is_dir() for p in files] == [True] * 4
    assert _cli(s, monkeypatch, "delete", "once", "-p", "vision", "--yes") == (
        0, f"deleted once (2 runs: ids {first.id}, {second.id})\n",
    )  # fmt: skip
    assert [p.exists() for p in files] == [False] * 4  # their working directories and logs went with them
    with pytest.raises(ApiError) as gone:
        c.describe("once", "vision")
    assert (gone.value.status, gone.value.reason) == (404, "no workload named 'once'")
    third = c.submit(WorkloadCreate(project="vision", name="once", gpus=1, command=["sleep", "600"]))
    assert c.describe("once", "vision").history == []
    s.wait_state("once", "running")
    code, out = _cli(s, monkeypatch, "delete", "once", "-p", "vision", "--yes")
    assert (code, out) == (1, "error: 'once' is running: cancel it first; only a finished workload can be deleted\n")
    assert c.describe("once", "vision").id == third.id


def test_apply_unchanged_changed_and_forced(s: Server) -> None:
    c = s.client()
    spec = WorkloadCreate(project="vision", name="svc", gpus=1, grace_s=1, command=["sleep", "600"])
    made = c.apply(spec)
    assert (made.created, made.unchanged) == (True, False)
    s.wait_state("svc", "running")
    same = c.apply(spec)
    assert (same.id, same.unchanged, same.created, same.state) == (made.id, True, False, "running")
    changed = spec.model_copy(update={"gpus": 2})
    with pytest.raises(ApiError) as refused:
        c.apply(changed)
    assert (refused.value.status, refused.value.reason) == (
        409, "'svc' runs another spec (gpus: 1 → 2); apply with force to replace it",
    )  # fmt: skip
    forced = c.apply(changed, force=True)
    assert (forced.created, forced.replaced) == (True, made.id)
    d = s.wait_state("svc", "running")
    assert (d["id"], d["gpus"], [h["id"] for h in d["history"]]) == (forced.id, 2, [made.id])
    wait_for(lambda: c.describe("svc").history[0].state == "cancelled", 30, "the replaced one to end")
