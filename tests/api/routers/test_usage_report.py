"""The usage report a new user asks for first: with no period it covers the day to now (as the portal's Costs page
does), a name run several times is one line by workload with its runs counted, and where no price is set the
report says so instead of showing a bare 0.00. Over the real app and store, the server's clock fixed, and the same
app served to the real `gpupool` command line."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpupool.store.tables import UsageRow
from tests.api.inprocess import Api, on_socket
from tests.api.routers.factories import Factory, client
from tests.e2e.conftest import GPUPOOL

NOW = datetime(2026, 4, 11, 12, 0, tzinfo=UTC).timestamp()
DAY = 86400


@pytest.fixture
def served(fresh_api: Callable[..., Api]) -> Iterator[tuple[Api, str]]:
    api = fresh_api()  # no prices
    api.ctx.controller.clock = lambda: NOW
    with on_socket(api.app) as url:
        yield api, url


def _minutes(workload: int, start: float, count: int) -> list[UsageRow]:
    """`count` minutes of one whole GPU from `start`, none of it busy."""
    first = int(start // 60)
    return [UsageRow(workload_id=workload, minute=first + i, pool="default", milli_seconds=60_000,
                     busy_milli_seconds=0) for i in range(count)]  # fmt: skip


@pytest.mark.anyio
async def test_a_report_with_no_period_covers_the_day_sums_a_names_runs_and_names_the_pools_without_a_price(
    served: tuple[Api, str],
) -> None:
    api, url = served
    async with client(api) as http:
        make = Factory(api, http)
        project = await make.project()
        first = await make.workload(project, name="train")
        await make.ok("POST", f"/api/v1/workloads/{first['id']}/cancel")
        await make.until_state(first, "cancelled")
        second = await make.workload(project, name="train")  # the name again: its second run
        other = await make.workload(project, name="eval")
        with api.ctx.sessions() as s:
            s.add_all(_minutes(first["id"], NOW - 3 * 3600, 30) + _minutes(second["id"], NOW - 3600, 30))
            s.add_all(_minutes(other["id"], NOW - 2 * DAY, 60))  # before the day: not in the default period
            s.commit()
        r = await http.get("/api/v1/reports/usage", params={"by": "workload"}, headers=make.admin.auth)
        assert r.status_code == 200, r.text
        report = r.json()
    assert (report["start"], report["end"]) == (NOW - DAY, NOW)
    zero = {"busy_gpu_hours": 0.0, "cost": 0.0, "busy_cost": 0.0, "idle_cost": 0.0, "on_prem_cost": 0.0,
            "burst_cost": 0.0, "burst_gpu_hours": 0.0}  # fmt: skip
    line = {"key": f"{project}/train", "gpu_hours": 1.0, "idle_gpu_hours": 1.0, "runs": 2, **zero}
    assert report["lines"] == [line]
    assert report["total"] == line | {"key": "total"}
    assert report["unpriced_pools"] == ["default"]

    env = {"GPUPOOL_URL": url, "GPUPOOL_TOKEN": api.admin_token, "PATH": "/usr/bin:/bin", "HOME": str(Path.home()),
           "COLUMNS": "200"}  # fmt: skip
    done = subprocess.run([GPUPOOL, "report", "usage", "--by", "workload"], env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in done.stdout.splitlines() if line.startswith("│")]
    assert rows == [
        [f"{project}/train", "2", "1.00", "0.00", "1.00", "0.00", "0.00", "0.00", "0.00", "0.00"],
        ["total", "2", "1.00", "0.00", "1.00", "0.00", "0.00", "0.00", "0.00", "0.00"],
    ]
    assert "usage by workload, 2026-04-10 12:00 to 2026-04-11 12:00 UTC" in done.stdout
    assert done.stdout.splitlines()[-1] == (
        "note: no price is set for pool default, so its cost counts as 0.00; the server prices a GPU-hour with "
        "--price default=DOLLARS (e.g. gpupool server --price default=2.50)"
    )
