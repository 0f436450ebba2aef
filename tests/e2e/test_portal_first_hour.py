"""What a new user trips over in the portal on day one (issue 32, item 8), in a real browser against a real server
on simulated GPUs: "My workloads" are the user's own and "All workloads" everyone's they may see; the ETA column
reads as an estimate; a gang's page says how many workers of what; a workload that has not started has a note,
not an error, where its files go; the navigation stays on one line in an 800-pixel window. And `gpupool list
--state` with several states, on the same server."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import Browser, Page, Route, expect

from tests.e2e.conftest import Server
from tests.e2e.test_portal import admin_page, shot, token_page


def names(page: Page) -> list[str]:
    return sorted(page.locator("#list tbody tr").evaluate_all("rows => rows.map((r) => r.dataset.name)"))


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_new_users_first_hour_in_the_portal(make_server: Callable[..., Server], browser: Browser) -> None:
    s = make_server("fake:2xH100-80GB")
    s.cli("department", "create", "research", "--deserved-gpus", "2")
    s.cli("project", "create", "vision", "--department", "research", "--deserved-gpus", "2")
    ana = s.json("user", "create", "ana", "--project", "vision")["token"]
    s.cli("submit", "-p", "vision", "--name", "gang", "--workers", "2", "--gpus", "1", "--", "sleep", "300")
    s.wait_state("gang", "running")
    s.cli("submit", "-p", "vision", "--name", "waiter", "--gpus", "1", "--", "sleep", "300")
    s.cli("submit", "-p", "vision", "--name", "anas", "--gpu", "0.5", "--", "sleep", "300", token=ana)
    s.wait_state("waiter", "pending")

    # Several states at once, repeated or separated by commas.
    assert sorted(w["name"] for w in s.json("list", "--state", "running,pending")) == ["anas", "gang", "waiter"]
    assert sorted(w["name"] for w in s.json("list", "--state", "running", "--state", "failed")) == ["gang"]

    page = admin_page(browser, s.url, s.admin_token)
    # An 800-pixel window: every page link on one line, the header one row high.
    page.set_viewport_size({"width": 800, "height": 600})
    box = page.evaluate("""() => ({
        tops: [...new Set([...document.querySelectorAll('nav a')].map((a) => a.getBoundingClientRect().top))],
        nav: document.getElementById('nav').getBoundingClientRect().height,
        link: Math.max(...[...document.querySelectorAll('nav a')].map((a) => a.getBoundingClientRect().height)),
        wide: document.documentElement.scrollWidth })""")
    assert (len(box["tops"]), box["nav"], box["wide"]) == (1, box["link"], 800), box
    expect(page.locator("#who")).to_have_attribute("title", "admin (admin)")  # whole, where the window cuts it
    shot(page, "15-nav-800px")
    page.set_viewport_size({"width": 1280, "height": 900})

    # My workloads: the admin's own; All workloads: everyone's, with a filter by user.
    expect(page.locator("main h2").nth(1)).to_have_text("My workloads")
    expect(page.locator("#list tbody tr")).to_have_count(2)
    assert names(page) == ["gang", "waiter"]
    expect(page.locator("#filters [name=user]")).to_have_count(0)
    page.click("nav a[data-page=all]")
    expect(page.locator("main h2").first).to_have_text("All workloads")
    expect(page.locator("#list tbody tr")).to_have_count(3)
    assert names(page) == ["anas", "gang", "waiter"]
    page.locator("#filters [name=user]").fill("ana")
    expect(page.locator("#list tbody tr")).to_have_count(1)
    expect(page.locator("#list tbody tr")).to_have_attribute("data-name", "anas")
    member = token_page(browser, s.url, ana)
    expect(member.locator("#who")).to_have_text("ana (member)")
    expect(member.locator("#list tbody tr")).to_have_count(1)
    expect(member.locator("#list tbody tr")).to_have_attribute("data-name", "anas")
    member.close()

    # The ETA column, for estimates the scheduler makes from the project's past runtimes (the server is made to
    # answer with one due in 20 s, and one in 2 h 30 min): what it rests on, in words, apart from the time.
    soon = (datetime.now(UTC) + timedelta(seconds=20)).isoformat()
    later = (datetime.now(UTC) + timedelta(hours=2, minutes=30, seconds=30)).isoformat()

    def estimated(route: Route) -> None:
        body = route.fetch().json()
        for w in body["items"]:
            if w["name"] in ("waiter", "anas"):
                w["eta"], w["eta_basis"] = (soon if w["name"] == "waiter" else later), "history"
        route.fulfill(status=200, content_type="application/json", body=json.dumps(body))

    def listing(url: str) -> bool:
        return "/api/v1/workloads?" in url

    page.route(listing, estimated)
    page.click("nav a[data-page=workloads]")
    waiter = page.locator("tr[data-name=waiter] td.eta")
    expect(waiter).to_have_text("within a minute from the project's past runtimes")
    expect(waiter.locator(".reason")).to_have_text("from the project's past runtimes")
    expect(page.locator("tr[data-name=gang] td.eta")).to_have_text("–")
    page.click("nav a[data-page=all]")
    expect(page.locator("tr[data-name=anas] td.eta span")).to_have_text("in 2h30m")
    shot(page, "16-eta-words")
    page.unroute(listing)

    # A gang's page: how many workers, of what, and how much in all.
    page.goto(f"{s.url}/#/workloads/vision/gang")
    expect(page.locator("#wl-summary tr[data-row=GPUs] td")).to_have_text("2 workers × 1 GPU (2 GPUs in all)")
    # One that has not started: its files section says so as a note.
    page.goto(f"{s.url}/#/workloads/vision/waiter")
    note = page.locator("#files #files-na")
    expect(note).to_have_text("'waiter' has not started: it has no files yet.")
    expect(note).to_have_class("reason")
    expect(page.locator("#files .error")).to_have_count(0)
    shot(page, "17-not-started-files")
