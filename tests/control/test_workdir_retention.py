"""A finished workload's working directory is kept for the retention (7 days unless the settings say otherwise),
then removed by the leader's housekeeping; cp of it then says why (410). The real app and loop over SQLite, a real
process, the loop's clock moved by the test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.observability.harness import Cluster, cluster


@pytest.fixture
def c(tmp_path: Path) -> Iterator[Cluster]:
    with cluster(tmp_path) as c:
        yield c


def test_a_finished_workdir_is_kept_for_its_retention_then_collected(c: Cluster) -> None:
    assert c.http("POST", "/api/v1/projects", {"name": "vision", "deserved_gpus": 4}).status_code == 201
    body = {"project": "vision", "name": "job", "type": "batch", "command": ["/bin/sh", "-c", "echo kept > out.txt"]}
    assert c.http("POST", "/api/v1/workloads", body).status_code == 201
    c.until(lambda: c.states()["job"] == "succeeded", "job to finish")
    files = "/api/v1/workloads/job/files?path=out.txt&project=vision"
    assert c.http("GET", files).content == b"kept\n"

    c.cycle(advance=6 * 86400.0)
    assert c.http("GET", files).content == b"kept\n"  # within its retention
    c.cycle(advance=2 * 86400.0)
    gone = c.http("GET", files)
    assert gone.status_code == 410, gone.text
    assert "removed 7 days after it ended" in gone.json()["detail"]
    assert c.http("GET", "/api/v1/workloads/job/logs?project=vision").status_code == 200  # its logs stay
