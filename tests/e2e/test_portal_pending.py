"""Pending work in the portal, in a real browser against a real server on simulated GPUs: the Why panel names the
real blocker with its numbers and the workload's place in its project's queue, and the ETA column tells when it
should start and what that rests on."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from playwright.sync_api import Browser, expect

from tests.e2e.conftest import Server
from tests.e2e.test_portal import admin_page, shot


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_why_panel_names_the_projects_limit_with_its_numbers_and_the_queue_position(
    make_server: Callable[..., Server], browser: Browser
) -> None:
    # Two GPUs and one free: only vision's limit of 1 holds its second job, not capacity.
    s = make_server("fake:2xH100-80GB")
    s.cli("department", "create", "research", "--deserved-gpus", "2")
    s.cli("project", "create", "vision", "--department", "research", "--deserved-gpus", "1", "--limit-gpus", "1")
    s.cli("submit", "-p", "vision", "--name", "first", "--gpus", "1", "--", "sleep", "300")
    s.wait_state("first", "running")
    for name in ("second", "third"):
        s.cli("submit", "-p", "vision", "--name", name, "--gpus", "1", "--", "sleep", "300")

    page = admin_page(browser, s.url, s.admin_token)
    row = page.locator("tr[data-name=second]")
    expect(row.locator(".state")).to_have_text("pending")
    expect(row.locator(".reason").first).to_have_text("over limit: vision 1+1/1 GPUs in default", timeout=15_000)
    row.get_by_role("button", name="Why").click()
    why = page.locator("#why")
    expect(why.locator(".why-reason")).to_have_text(
        "would put project vision over its limit in pool default: uses 1 of 1 GPU, asks 1 (1 over) over-limit"
    )
    expect(why.locator(".why-reason code")).to_have_text("over-limit")
    expect(why.locator(".why-numbers")).to_have_text(
        "queue=vision level=project pool=default resource=gpu used=1000 quota=1000 asks=1000"
    )
    expect(why.locator(".why-position")).to_have_text(
        "Position: 1 of 2 in project vision's queue (by priority, then submit time)"
    )
    page.locator("tr[data-name=third]").get_by_role("button", name="Why").click()
    expect(page.locator("#why .why-position")).to_have_text(
        "Position: 2 of 2 in project vision's queue (by priority, then submit time)"
    )
    shot(page, "10-why-over-limit")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_eta_column_shows_when_a_job_behind_a_declared_max_duration_starts_and_a_dash_for_running_work(
    make_server: Callable[..., Server], browser: Browser
) -> None:
    s = make_server("fake:1xH100-80GB")
    s.cli("department", "create", "research", "--deserved-gpus", "1")
    s.cli("project", "create", "vision", "--department", "research", "--deserved-gpus", "1")
    s.cli("submit", "-p", "vision", "--name", "hog", "--gpus", "1", "--max-duration", "1h", "--", "sleep", "300")
    started = s.wait_state("hog", "running")["started_at"]
    s.cli("submit", "-p", "vision", "--name", "waiter", "--gpus", "1", "--", "sleep", "300")

    page = admin_page(browser, s.url, s.admin_token)
    eta = page.locator("tr[data-name=waiter] td.eta")
    # The hog's start plus its declared hour, seen from a minute or less after that start.
    expect(eta.locator("span")).to_have_text("in 59m", timeout=15_000)
    expect(eta.locator(".reason")).to_have_text("from declared max durations")
    when = page.evaluate("(ms) => new Date(ms).toLocaleString()", (started + 3600) * 1000)
    expect(eta.locator("span")).to_have_attribute("title", when)
    expect(page.locator("tr[data-name=hog] td.eta")).to_have_text("–")
    shown = s.workload("waiter")
    # To the microsecond, as the API writes it.
    assert (datetime.fromisoformat(shown["eta"]), shown["eta_basis"]) == (
        datetime.fromtimestamp(started + 3600, UTC), "declared",
    )  # fmt: skip
    shot(page, "11-eta")
