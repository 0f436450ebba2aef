"""A workload's max_duration at the API's edge, and start-time estimates end to end: the real app and scheduler
over SQLite on simulated GPUs, real processes (sleeps) running."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.api.test_pending_reasons import _ok
from tests.observability.harness import Cluster, cluster


@pytest.fixture
def c(tmp_path: Path) -> Iterator[Cluster]:
    with cluster(tmp_path) as c:
        yield c


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "Input should be greater than 0"),
        (-60, "Input should be greater than 0"),
        (1e12, "Input should be less than or equal to 2592000"),
        ("4h", "Input should be a valid number, unable to parse string as a number"),
    ],
)
def test_a_max_duration_that_is_not_a_positive_duration_of_at_most_30_days_is_refused(
    c: Cluster, value: Any, message: str
) -> None:
    _ok(c, "POST", "/api/v1/projects", {"name": "vision", "deserved_gpus": 1})
    body = {"project": "vision", "name": "j", "gpus": 1, "max_duration_s": value, "command": ["true"]}
    r = c.http("POST", "/api/v1/workloads", body)
    assert r.status_code == 422, r.text
    assert [(e["loc"][-1], e["msg"]) for e in r.json()["detail"]] == [("max_duration_s", message)]
