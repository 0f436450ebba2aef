"""Right-sizing advice in the portal, in a real browser. The advice needs half an hour of telemetry samples, so the
server here is the real app served by uvicorn with its scheduler loop driven on a clock the test moves (as
tests/api/test_rightsizing.py serves it to the real command line), over SQLite, with a real process (a sleep) on
a simulated GPU: it keeps the GPU idle and holds a few MiB. The clock starts three hours back, so that its half
hour of samples falls in the week to the browser's now that the Waste page asks for."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, expect

from tests.api.inprocess import on_socket
from tests.e2e.conftest import wait_for
from tests.e2e.test_portal import admin_page, shot
from tests.observability.harness import Cluster, cluster

ADVICE = "used at most 0.1 GiB of 80, busy 0% of the time: ask --gpu-memory 1GiB or --gpu 0.1"


@pytest.fixture
def sampled(tmp_path: Path) -> Iterator[tuple[Cluster, str]]:
    """Project lab's job "sleeper" on a whole GPU, idle, sampled for 30 minutes; the cluster and its URL."""
    with cluster(tmp_path) as c:
        c.clock.now -= 3 * 3600
        # Requests through the socket: Playwright's sync API holds this thread's event loop.
        with on_socket(c.api.app) as url:
            for path, body in (
                ("/api/v1/departments", {"name": "research", "deserved_gpus": 4}),
                ("/api/v1/projects", {"name": "lab", "department": "research", "deserved_gpus": 2}),
                ("/api/v1/workloads", {"project": "lab", "name": "sleeper", "gpus": 1, "grace_s": 5,
                                       "command": ["sleep", "600"]}),
            ):  # fmt: skip
                r = httpx.post(url + path, json=body, headers=c.api.auth())
                assert r.status_code == 201, r.text
            c.controller.telemetry_interval_s = 1e9  # no samples while it starts
            c.until(lambda: c.states()["sleeper"] == "running", "sleeper to run")
            backend = c.api.ctx.backend

            # Running from its launch, it first finds its Python environment (a Python process, tens of MiB, busy
            # for a moment), then is `sleep` (a few MiB): idle once it is that.
            def idle() -> bool:
                return [(m.util_pct, m.memory_used_mib < 10) for m in backend.sample().members.values()] == [(0, True)]

            wait_for(idle, 30, "sleeper to be idle")
            c.controller.telemetry_interval_s = 60.0
            c.cycle(advance=1000.0)  # after a gap nothing is charged: this sample only sets the clock of the next
            for _ in range(30):
                c.cycle(advance=60.0)
            yield c, url


def test_a_workload_far_under_its_request_gets_advice_by_its_logs_and_in_the_waste_pages_report(
    sampled: tuple[Cluster, str], browser: Browser
) -> None:
    c, url = sampled
    page = admin_page(browser, url, c.api.admin_token)

    page.locator("tr[data-name=sleeper]").get_by_role("button", name="Logs").click()
    advice = page.locator("#detail #advice")
    expect(advice).to_have_text(f"Right-size: {ADVICE}")
    expect(advice.locator("code")).to_have_text(["--gpu-memory 1GiB", "--gpu 0.1"])
    shot(page, "12-rightsizing-advice")

    page.click("nav a[data-page=waste]")
    expect(page.locator("#rightsizing tbody tr")).to_have_count(1)
    # Peak use: memory at most 0.1 GiB, utilisation 0%; 30 minutes of a whole GPU, of which 0.1 would have done.
    expect(page.locator("#rightsizing tr[data-workload='lab/sleeper'] td")).to_have_text(
        ["sleeper", "lab", "1 GPU", "0.1 GiB, 0%", "0%", "0.50", "0.45", ADVICE]
    )
    expect(page.locator("#rightsizing-projects tbody tr")).to_have_text(["lab0.500.451", "total0.500.451"])
    shot(page, "13-waste-rightsizing")
