"""The costs page in a real browser: each line's on-premises and burst cost, and a department's burst budget block
(spent and forecast this month against its budget). The real app over SQLite, served by uvicorn, its clock at a
fixed instant in the past (no loop runs); the rented nodes' bills and a minute of usage written into the store as
the hub's loop and meter write them.

Ten days into April 2021 (30 days) department research has rented a 1-GPU node at $3.60/GPU-hour for 1000 s
($1.00) and holds a 2-GPU node at $1.80 asked an hour ago ($3.60 so far, $3.60 an hour): $4.60 spent, $13.80 at
that pace, against $100 a month. Nothing of it falls in the page's last 24 hours: nothing rented there."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, expect

from gpupool.store.tables import BurstNodeRow, UsageRow
from tests.api.inprocess import on_socket
from tests.e2e.test_portal import admin_page, shot
from tests.observability.harness import Cluster, cluster

NOW = datetime(2021, 4, 11, tzinfo=UTC).timestamp()


@pytest.fixture
def billed(tmp_path: Path) -> Iterator[tuple[Cluster, str]]:
    with cluster(tmp_path) as c:
        c.clock.now = NOW
        with on_socket(c.api.app) as url:
            for method, path, body in (
                ("POST", "/api/v1/departments", {"name": "research", "deserved_gpus": 4}),
                ("POST", "/api/v1/projects", {"name": "lab", "department": "research", "deserved_gpus": 2}),
                ("PUT", "/api/v1/departments/research/burst", {"monthly_budget": 100}),
                ("POST", "/api/v1/workloads", {"project": "lab", "name": "train", "gpus": 2, "command": ["true"]}),
            ):  # fmt: skip
                r = httpx.request(method, url + path, json=body, headers=c.api.auth())
                assert r.status_code < 300, r.text
            job = r.json()["id"]
            minute = int(time.time() // 60) - 5  # in the page's last 24 hours, by the browser's clock
            with c.api.ctx.sessions() as s:
                s.add_all([
                    BurstNodeRow(name="research-a", cluster="cloud", department="research", gpus=1,
                                 price_micro=3_600_000, phase="released", asked_at=NOW - 5000,
                                 released_at=NOW - 4000, for_workloads=[]),
                    BurstNodeRow(name="research-b", cluster="cloud", department="research", gpus=2,
                                 price_micro=1_800_000, phase="ready", asked_at=NOW - 3600, for_workloads=[]),
                    # A minute of 2 GPUs on a node at $1.80: $0.06 of burst, none on-premises.
                    UsageRow(workload_id=job, minute=minute, pool="default", milli_seconds=120_000,
                             busy_milli_seconds=60_000, burst_price_micro=1_800_000),
                ])  # fmt: skip
                s.commit()
            yield c, url


def test_the_costs_page_splits_the_cost_and_draws_each_budget_with_spent_and_forecast(
    billed: tuple[Cluster, str], browser: Browser
) -> None:
    c, url = billed
    page = admin_page(browser, url, c.api.admin_token)
    page.click("nav a[data-page=costs]")
    # lab: 2 GPUs for a minute (0.033 GPU-h), cost 0.06, all of it burst; busy half.
    expect(page.locator("#costs tr[data-key=lab] td")).to_have_text(
        ["lab", "0.033", "0.017", "0.017", "0.06", "0.00", "0.06", "0.03", "0.03"]
    )
    expect(page.locator("#budgets tr[data-department=research] td")).to_have_text(
        ["research", "$100.00", "$4.60", "$13.80", "$3.60", "$0.00", "$0.00", "–"]
    )
    bar = page.locator("#budgets svg g[data-department=research]")
    expect(bar.locator("text").nth(1)).to_have_text("$4.60 of $100.00, forecast $13.80")
    expect(bar.locator("line.budget")).to_have_count(1)
    shot(page, "14-costs-burst-budgets")
