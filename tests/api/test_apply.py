"""Names, rerun, delete and declarative apply in-process (the real app and scheduler, real processes on
simulated GPUs, the loop driven by hand), on SQLite and on PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from gpupool.store.tables import AuditRow, EventRow, WorkloadRow
from tests.api.inprocess import make_api
from tests.observability.harness import Clock, Cluster

SPEC = {"project": "vision", "gpus": 1, "grace_s": 1, "command": ["sleep", "600"]}


@pytest.fixture(params=["sqlite", "postgresql"])
def c(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    url = None if request.param == "sqlite" else request.getfixturevalue("postgres").new_database()
    c = Cluster(make_api(tmp_path, "fake:4xH100-80GB", db_url=url), Clock(time.time()))
    try:
        assert c.http("POST", "/api/v1/projects", {"name": "vision", "deserved_gpus": 4}).status_code == 201
        yield c
    finally:
        c.stop_everything()


def _call(c: Cluster, method: str, path: str, body: Any = None, status: int = 200, token: str | None = None) -> Any:
    r = c.http(method, path, body, token)
    assert r.status_code == status, r.text
    return r.json()


def _rows(c: Cluster, name: str) -> list[WorkloadRow]:
    with c.api.ctx.sessions() as s:
        return list(s.scalars(select(WorkloadRow).where(WorkloadRow.name == name).order_by(WorkloadRow.id)))


def _events(c: Cluster) -> int:
    with c.api.ctx.sessions() as s:
        return int(s.scalar(select(func.count()).select_from(EventRow)) or 0)


def test_a_finished_workloads_name_is_free_and_rerun_keeps_its_history(c: Cluster) -> None:
    first = _call(c, "POST", "/api/v1/workloads", {**SPEC, "name": "job", "command": ["true"]}, 201)
    clash = c.http("POST", "/api/v1/workloads", {**SPEC, "name": "job"})
    assert (clash.status_code, clash.json()) == (409, {"detail": "project 'vision' already has a workload named 'job'"})
    live = _call(c, "POST", "/api/v1/workloads/job/rerun?project=vision", status=409)
    assert live == {"detail": "'job' is pending: only a finished workload can be run again"}
    c.until(lambda: _rows(c, "job")[-1].state == "succeeded", "the job to end")

    again = _call(c, "POST", "/api/v1/workloads/job/rerun?project=vision", status=201)
    assert again["id"] != first["id"] and again["state"] == "pending"
    c.until(lambda: _rows(c, "job")[-1].state == "succeeded", "the rerun to end")
    third = _call(c, "POST", "/api/v1/workloads", {**SPEC, "name": "job", "command": ["true"]}, 201)
    d = _call(c, "GET", "/api/v1/workloads/job?project=vision")
    assert d["id"] == third["id"]
    assert [(h["id"], h["state"], h["attempts"], h["exit_code"]) for h in d["history"]] == [
        (first["id"], "succeeded", 1, 0), (again["id"], "succeeded", 1, 0),
    ]  # fmt: skip
    assert [r.spec for r in _rows(c, "job")] == [{"gpus": 1, "grace_s": 1.0, "command": ["true"]}] * 3


def test_delete_removes_a_finished_workload_and_its_history_and_refuses_a_live_one(c: Cluster) -> None:
    _call(c, "POST", "/api/v1/workloads", {**SPEC, "name": "old", "command": ["true"]}, 201)
    c.until(lambda: _rows(c, "old")[-1].state == "succeeded", "it to end")
    _call(c, "POST", "/api/v1/workloads/old/rerun?project=vision", status=201)
    refused = _call(c, "DELETE", "/api/v1/workloads/old?project=vision", status=409)
    assert refused == {"detail": "'old' is pending: cancel it first; only a finished workload can be deleted"}
    c.until(lambda: _rows(c, "old")[-1].state == "succeeded", "the rerun to end")

    ids = [r.id for r in _rows(c, "old")]
    assert _call(c, "DELETE", "/api/v1/workloads/old?project=vision") == {"deleted": ids}
    assert _call(c, "GET", "/api/v1/workloads/old?project=vision", status=404) == {"detail": "no workload named 'old'"}
    assert [w["name"] for w in _call(c, "GET", "/api/v1/workloads?project=vision")["items"]] == []
    assert _call(c, "DELETE", "/api/v1/workloads/old?project=vision", status=404) == {
        "detail": "no workload named 'old'"
    }
    assert all(r.deleted_at is not None for r in _rows(c, "old"))  # kept for usage reports
    with c.api.ctx.sessions() as s:
        audited = s.scalars(select(AuditRow.status).where(AuditRow.action.like("DELETE%"))).all()
    assert list(audited) == [409, 200, 404]


def test_apply_unchanged_changed_and_forced(c: Cluster) -> None:
    made = _call(c, "PUT", "/api/v1/workloads/svc?project=vision", SPEC, 201)
    assert (made["created"], made["unchanged"], made["replaced"]) == (True, False, None)
    c.until(lambda: _rows(c, "svc")[-1].state == "running", "it to run")
    version, events = _rows(c, "svc")[-1].version, _events(c)

    same = _call(c, "PUT", "/api/v1/workloads/svc?project=vision", {**SPEC, "name": "svc"})
    assert (same["id"], same["unchanged"], same["created"], same["state"]) == (made["id"], True, False, "running")
    assert (_rows(c, "svc")[-1].version, _events(c)) == (version, events)  # nothing written

    changed = {**SPEC, "gpus": 2, "env": {"A": "1"}}
    r = c.http("PUT", "/api/v1/workloads/svc?project=vision", changed)
    assert r.status_code == 409
    assert r.json() == {
        "detail": "'svc' runs another spec (env: None → {'A': '1'}; gpus: 1 → 2); apply with force to replace it",
        "differs": {"env": {"old": None, "new": {"A": "1"}}, "gpus": {"old": 1, "new": 2}},
    }
    forced = _call(c, "PUT", "/api/v1/workloads/svc?project=vision&force=true", changed, 201)
    assert (forced["created"], forced["replaced"], forced["state"]) == (True, made["id"], "pending")
    old, new = _rows(c, "svc")
    assert (old.state, old.stop_reason, old.live_name, new.live_name) == ("running", "cancel", None, "svc")
    c.until(lambda: [r.state for r in _rows(c, "svc")] == ["cancelled", "running"], "the old one to stop")
    assert _call(c, "GET", "/api/v1/workloads/svc?project=vision")["id"] == forced["id"]


def test_a_viewer_may_not_rerun_delete_or_apply_and_another_tenant_sees_nothing(c: Cluster) -> None:
    assert c.http("POST", "/api/v1/projects", {"name": "other", "deserved_gpus": 0}).status_code == 201
    tokens = {}
    for name, role, project in (("vic", "viewer", "vision"), ("oto", "member", "other")):
        made = _call(c, "POST", "/api/v1/users", {"name": name, "role": role, "projects": [project]}, 201)
        tokens[name] = made["token"]
    _call(c, "POST", "/api/v1/workloads", {**SPEC, "name": "done", "command": ["true"]}, 201)
    c.until(lambda: _rows(c, "done")[-1].state == "succeeded", "it to end")
    calls = [
        ("POST", "/api/v1/workloads/done/rerun?project=vision", None, "rerun"),
        ("DELETE", "/api/v1/workloads/done?project=vision", None, "delete"),
        ("PUT", "/api/v1/workloads/done?project=vision", SPEC, "apply"),
    ]
    for method, path, body, verb in calls:
        assert _call(c, method, path, body, 403, tokens["vic"]) == {
            "detail": f"your role (viewer) cannot {verb} workloads"
        }
        assert _call(c, method, path, body, 404, tokens["oto"]) == {"detail": "no project named 'vision'"}
    assert len(_rows(c, "done")) == 1
