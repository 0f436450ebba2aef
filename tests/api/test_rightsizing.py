"""The right-sizing report over the real app and SQLite, with telemetry as the local backend's simulated GPUs
report it (real processes: a sleep keeps its GPU idle and holds a few MiB; a Python process holds 600 MiB), half an
hour of samples on the test's clock; the report through the API (who may read it, a bad period) and through the
real `gpupool` command against the same app served by uvicorn."""

from __future__ import annotations

import csv
import io
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.api.inprocess import on_socket
from tests.e2e.conftest import GPUPOOL, wait_for
from tests.observability.harness import Cluster, cluster

FAT = [sys.executable, "-c", "import time; b = b'x' * (600 << 20); time.sleep(600)"]


@pytest.fixture(scope="module")
def sampled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, dict[str, str], float]]:
    """Three workloads of p1 sampled for 30 minutes; a viewer of p2. Yields the cluster, tokens and the end."""
    with cluster(tmp_path_factory.mktemp("rightsizing")) as c:
        admin = c.api.admin_token

        def ok(method: str, path: str, body: Any) -> Any:
            r = c.http(method, path, body, admin)
            assert r.status_code < 300, r.text
            return r.json()

        ok("POST", "/api/v1/departments", {"name": "d1", "deserved_gpus": 4})
        for name, gpus in (("p1", 3), ("p2", 1)):
            ok("POST", "/api/v1/projects", {"name": name, "department": "d1", "deserved_gpus": gpus})
        vic = ok("POST", "/api/v1/users", {"name": "vic", "role": "viewer", "projects": ["p2"]})["token"]
        # No samples while they start: what a process does as it starts is not what it does.
        c.controller.telemetry_interval_s = 1e9
        c.cycle()
        for name, ask, command in (
            ("nb", {"gpus": 1}, ["sleep", "600"]),
            ("ddp", {"gpus": 2}, ["sleep", "600"]),
            ("fat", {"gpu_memory": "1GiB"}, FAT),
        ):
            ok("POST", "/api/v1/workloads", {"project": "p1", "name": name, "command": command, "grace_s": 5, **ask})
        c.until(lambda: set(c.states().values()) == {"running"}, "the three to run")
        backend = c.api.ctx.backend

        def settled() -> bool:
            seen = backend.sample().members.values()
            return len(seen) == 3 and {m.util_pct for m in seen} == {0} and max(m.memory_used_mib for m in seen) >= 600

        wait_for(settled, 60, "the three to settle (idle, and 600 MiB held)")
        c.controller.telemetry_interval_s = 60.0
        c.cycle(advance=1000.0)  # after a gap nothing is charged: this sample only sets the clock of the next
        for _ in range(30):
            c.cycle(advance=60.0)
        yield c, {"admin": admin, "vic": vic}, math.ceil(c.clock.now + 60)


def _get(c: Cluster, token: str, **params: Any) -> tuple[int, Any]:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    r = c.http("GET", f"/api/v1/reports/rightsizing?{query}", token=token)
    return r.status_code, r.json()


def test_the_report_advises_from_half_an_hour_of_samples(sampled: tuple[Cluster, dict[str, str], float]) -> None:
    c, tokens, end = sampled
    status, body = _get(c, tokens["admin"], project="p1", start=0, end=end)
    assert status == 200
    lines = body["lines"]
    figures = ("workload", "request", "sampled_minutes", "gpu_hours", "freed_gpu_hours")
    assert [tuple(x[k] for k in figures) for x in lines] == [
        ("ddp", "2 GPUs", 30, 1.0, 0.5), ("nb", "1 GPU", 30, 0.5, 0.45), ("fat", "1GiB GPU memory", 30, 0.0065, 0.0),
    ]  # fmt: skip
    advice = {x["workload"]: x["advice"] for x in lines}
    assert advice["ddp"] == {
        "rule": "gpus", "gpus": 1, "gpu": None, "gpu_memory_mib": None, "advised_milli": 1000, "granted_milli": 2000,
        "message": "busy at most 0% of 2 GPUs and used at most 0.1 GiB of 160: ask `--gpus 1`",
    }  # fmt: skip
    assert advice["nb"] == {
        "rule": "share", "gpus": None, "gpu": 0.1, "gpu_memory_mib": 1024, "advised_milli": 100,
        "granted_milli": 1000,
        "message": "used at most 0.1 GiB of 80, busy 0% of the time: ask `--gpu-memory 1GiB` or `--gpu 0.1`",
    }  # fmt: skip
    # It held 600 MiB of its 1 GiB: more than half, so no advice.
    assert advice["fat"] is None and lines[2]["peak_gpu_memory_mib"] >= 600 and lines[2]["busy_pct"] == 0.0
    assert body["projects"] == [{"project": "p1", "gpu_hours": 1.5065, "freed_gpu_hours": 0.95, "advised": 2}]
    assert body["total"] == {"project": "total", "gpu_hours": 1.5065, "freed_gpu_hours": 0.95, "advised": 2}


def test_describe_carries_the_advice(sampled: tuple[Cluster, dict[str, str], float]) -> None:
    c, tokens, _ = sampled
    r = c.http("GET", "/api/v1/workloads/nb?project=p1", token=tokens["admin"])
    assert r.status_code == 200
    assert r.json()["rightsizing"]["message"] == (
        "used at most 0.1 GiB of 80, busy 0% of the time: ask `--gpu-memory 1GiB` or `--gpu 0.1`"
    )
    fat = c.http("GET", "/api/v1/workloads/fat?project=p1", token=tokens["admin"]).json()
    assert fat["rightsizing"] is None


def test_who_may_read_the_report_and_a_bad_period(sampled: tuple[Cluster, dict[str, str], float]) -> None:
    c, tokens, end = sampled
    # A viewer of p2 reads its own projects (nothing ran there); p1 is as if it did not exist.
    assert _get(c, tokens["vic"], start=0, end=end)[1]["lines"] == []
    assert _get(c, tokens["vic"], project="p1", start=0, end=end) == (404, {"detail": "no project named 'p1'"})
    assert _get(c, tokens["admin"], project="nope") == (404, {"detail": "no project named 'nope'"})
    # The same refusal as the usage report's (a 422, as every invalid input of this API).
    empty = {"detail": "the period is empty: 'to' must be after 'from'"}
    assert _get(c, tokens["admin"], start=10, end=5) == (422, empty)
    status, body = _get(c, tokens["admin"], start="nan", end=5)
    assert (status, [e["type"] for e in body["detail"]]) == (422, ["finite_number"])
    # No period: the week to now (the test's clock is ahead of the server's, so nothing falls in it).
    assert _get(c, tokens["admin"], project="p1")[1]["lines"] == []


@pytest.fixture(scope="module")
def served(sampled: tuple[Cluster, dict[str, str], float]) -> Iterator[str]:
    """The same app on a socket, for the real command line."""
    with on_socket(sampled[0].api.app) as url:
        yield url


def _cli(url: str, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"GPUPOOL_URL": url, "GPUPOOL_TOKEN": token, "PATH": "/usr/bin:/bin", "HOME": str(Path.home()),
           "COLUMNS": "300"}  # fmt: skip
    return subprocess.run([GPUPOOL, "report", "rightsizing", *args], env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")


def test_the_command_line_writes_the_report_as_csv_json_and_a_table(
    sampled: tuple[Cluster, dict[str, str], float], served: str
) -> None:
    c, tokens, end = sampled
    period = ("--from", _iso(0), "--to", _iso(end))
    done = _cli(served, tokens["admin"], "-p", "p1", *period, "-o", "csv")
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    keep = ("workload", "request", "gpu_hours", "freed_gpu_hours", "advised_gpus", "advised_gpu",
            "advised_gpu_memory_mib", "advice")  # fmt: skip
    assert [tuple(r[k] for k in keep) for r in rows] == [
        ("ddp", "2 GPUs", "1.0", "0.5", "1", "", "", "busy at most 0% of 2 GPUs and used at most 0.1 GiB of 160: "
         "ask `--gpus 1`"),
        ("nb", "1 GPU", "0.5", "0.45", "", "0.1", "1024", "used at most 0.1 GiB of 80, busy 0% of the time: ask "
         "`--gpu-memory 1GiB` or `--gpu 0.1`"),
        ("fat", "1GiB GPU memory", "0.0065", "0.0", "", "", "", ""),
    ]  # fmt: skip
    as_json = _cli(served, tokens["admin"], "-p", "p1", *period, "-o", "json")
    assert json.loads(as_json.stdout) == _get(c, tokens["admin"], project="p1", start=0, end=end)[1]
    table = _cli(served, tokens["admin"], *period)
    assert table.returncode == 0 and "GPU-hours right-sizing would have freed" in table.stdout
    assert "ask `--gpus 1`" in table.stdout
    refused = _cli(served, tokens["vic"], "-p", "p1", *period)
    assert (refused.returncode, refused.stderr) == (1, "error: no project named 'p1'\n")
    wrong = _cli(served, tokens["admin"], "-o", "yaml")
    assert (wrong.returncode, wrong.stderr) == (2, "error: -o must be table, json or csv\n")
