"""Pending reasons with their numbers, end to end: the real app and scheduler over SQLite on 4 simulated GPUs,
real processes (sleeps) running. A workload over its project's limit on a full cluster says which quota, how much
is used and asked (not that no node has room), in describe, in list and through the CLI's rendering; the numbers
follow a quota change; a workload that reclaims says whose borrowed GPUs it waits for; one that would preempt work
still within its minimum runtime says whose, and until when."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpupool.cli.workloads import describe_text, print_list
from gpupool.models.schemas import WorkloadDetail, WorkloadPublic
from tests.observability.harness import Cluster, cluster

SLEEP = ["sleep", "600"]


@pytest.fixture
def c(tmp_path: Path) -> Iterator[Cluster]:
    with cluster(tmp_path) as c:
        yield c


def _ok(c: Cluster, method: str, path: str, body: Any = None) -> Any:
    r = c.http(method, path, body)
    assert r.status_code < 300, r.text
    return r.json()


def _submit(c: Cluster, project: str, name: str, gpus: int) -> None:
    _ok(
        c, "POST", "/api/v1/workloads", {"project": project, "name": name, "gpus": gpus, "grace_s": 1, "command": SLEEP}
    )


def _running(c: Cluster, *names: str) -> None:
    c.until(lambda: all(c.states()[n] == "running" for n in names), f"{names} to run")


def _describe(c: Cluster, project: str, name: str) -> dict[str, Any]:
    return dict(_ok(c, "GET", f"/api/v1/workloads/{name}?project={project}"))


def test_a_job_over_its_projects_limit_names_the_quota_and_its_numbers(
    c: Cluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _ok(c, "POST", "/api/v1/departments", {"name": "d1", "deserved_gpus": 4})
    _ok(c, "POST", "/api/v1/projects", {"name": "vision", "department": "d1", "deserved_gpus": 2, "limit_gpus": 3})
    _ok(c, "POST", "/api/v1/projects", {"name": "nlp", "department": "d1", "deserved_gpus": 2})
    _submit(c, "nlp", "n1", 2)
    _submit(c, "vision", "a", 2)
    _running(c, "n1", "a")
    _submit(c, "vision", "b", 2)  # the cluster is full, but the limit is what holds it
    _submit(c, "vision", "c", 1)
    c.cycle()

    d = _describe(c, "vision", "b")
    assert (d["state"], d["reason_code"]) == ("pending", "over-limit")
    assert d["reason"] == "would put project vision over its limit in pool default: uses 2 of 3 GPUs, asks 2 (1 over)"
    assert d["reason_args"] == {
        "queue": "vision", "level": "project", "pool": "default", "resource": "gpu", "used": 2000, "quota": 3000,
        "asks": 2000,
    }  # fmt: skip
    assert d["position"] == {"project": 1, "project_queued": 2}
    assert _describe(c, "vision", "c")["position"] == {"project": 2, "project_queued": 2}
    listed = {w["name"]: w for w in _ok(c, "GET", "/api/v1/workloads?project=vision")["items"]}
    assert (listed["b"]["reason_code"], listed["b"]["reason"], listed["b"]["reason_short"]) == (
        "over-limit", d["reason"], "over limit: vision 2+2/3 GPUs in default",
    )  # fmt: skip
    assert listed["b"]["reason_args"] == d["reason_args"]
    assert listed["a"]["reason_args"] == {}  # running: no scheduler reason

    describe_text(WorkloadDetail.model_validate(d))
    shown = capsys.readouterr().out.splitlines()
    assert [line for line in shown if line.startswith(("Reason:", "Numbers:", "Position:"))] == [
        f"Reason:      {d['reason']} [over-limit]",
        "Numbers:     queue=vision level=project pool=default resource=gpu used=2000 quota=3000 asks=2000",
        "Position:    1 of 2 in project vision's queue (by priority, then submit time)",
    ]
    monkeypatch.setenv("COLUMNS", "200")  # the table as a wide terminal shows it, one line a row
    print_list([WorkloadPublic.model_validate(listed["b"])])
    row = next(line for line in capsys.readouterr().out.splitlines() if " b " in line)
    assert [cell.strip() for cell in row.strip("│ ").split("│")][5:9] == [
        "pending", "2 GPUs", "-", "over limit: vision 2+2/3 GPUs in default",
    ]  # fmt: skip

    # A higher limit moves the numbers: the scheduler writes the reason again.
    _ok(c, "PATCH", "/api/v1/queues/vision/quota", {"limit_gpus": 3.5})
    c.cycle()
    d = _describe(c, "vision", "b")
    assert (d["reason_code"], d["reason"]) == (
        "over-limit",
        "would put project vision over its limit in pool default: uses 2 of 3.5 GPUs, asks 2 (0.5 over)",
    )
    assert (d["reason_args"]["quota"], d["reason_args"]["used"]) == (3500, 2000)


def test_a_job_that_reclaims_says_whose_borrowed_gpus_it_waits_for(c: Cluster) -> None:
    _ok(c, "POST", "/api/v1/departments", {"name": "d1", "deserved_gpus": 4})
    _ok(c, "POST", "/api/v1/projects", {"name": "vision", "department": "d1", "deserved_gpus": 2})
    _ok(c, "POST", "/api/v1/projects", {"name": "nlp", "department": "d1", "deserved_gpus": 2})
    for i in range(4):
        _submit(c, "nlp", f"n{i}", 1)  # nlp borrows vision's two idle GPUs
    _running(c, "n0", "n1", "n2", "n3")
    _submit(c, "vision", "v", 2)
    c.cycle()  # reclaims two of nlp's; v waits for them to stop

    d = _describe(c, "vision", "v")
    node = d["reason_args"]["nodes"]
    assert (d["state"], d["reason_code"], d["reason_args"]) == (
        "pending",
        "waiting-for-evictions",
        {"victims": 2, "gpu_milli": 2000, "borrowers": "nlp", "nodes": node},
    )
    assert d["reason"] == f"waiting for 2 evicted workloads of project nlp to release 2 GPUs; it will start on {node}"
    assert sorted(n["name"] for n in _ok(c, "GET", "/api/v1/nodes")) == [node]


def test_a_job_held_back_by_a_minimum_runtime_says_until_when(c: Cluster) -> None:
    _ok(c, "POST", "/api/v1/projects", {"name": "vision", "deserved_gpus": 4})
    _ok(c, "POST", "/api/v1/workloads", {"project": "vision", "name": "train", "gpus": 4, "priority": "training",
                                         "grace_s": 1, "command": SLEEP})  # fmt: skip
    _running(c, "train")
    _ok(c, "POST", "/api/v1/workloads", {"project": "vision", "name": "serve", "gpus": 1, "priority": "production",
                                         "grace_s": 1, "command": SLEEP})  # fmt: skip
    c.cycle()

    until = int(_describe(c, "vision", "train")["started_at"] + 600)  # training's minimum runtime: 10 minutes
    d = _describe(c, "vision", "serve")
    assert (d["reason_code"], d["reason_args"]) == (
        "min-runtime",
        {"until": until, "victim": "'train'", "project": "vision", "gpu_milli": 4000},
    )
    at = datetime.fromtimestamp(until, UTC).strftime("%Y-%m-%d %H:%M:%S")
    assert d["reason"] == (
        f"waiting for 'train' of project vision to pass its minimum runtime at {at} UTC; then its 4 GPUs may be taken"
    )
    assert d["reason_short"] == f"min runtime of 'train' until {at[11:16]} UTC"

    c.cycle(advance=600.0)  # its minimum runtime over: it is preempted, and serve waits for it to stop
    d = _describe(c, "vision", "serve")
    assert (d["reason_code"], d["reason_args"]["victims"], d["reason_args"]["borrowers"]) == (
        "waiting-for-evictions", 1, "",
    )  # fmt: skip
    assert d["reason"].startswith("waiting for 1 evicted workload to release 4 GPUs; it will start on ")
