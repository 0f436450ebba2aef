"""A workload's own page in a real browser (Playwright driving Debian's chromium) against a real server on
simulated GPUs: its summary, charts drawn by uPlot that take live samples, logs followed as the job writes them,
cancel behind a confirmation; the session kept in cookies, so a new tab is signed in; and a batch sweep that
submits one workload per value."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Dialog, expect

from tests.e2e import test_portal
from tests.e2e.conftest import Server
from tests.e2e.test_portal import admin_page, shot

# Prints a line every half second while it keeps a CPU busy (simulated GPUs model their use from the CPU).
TRAIN = "i=0; while [ $i -lt 40 ]; do echo step $i; i=$((i+1)); sleep 0.5; done & while :; do :; done"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_workload_page_charts_follows_logs_and_cancels_after_asking(
    make_server: Callable[..., Server], browser: Browser
) -> None:
    s = make_server("fake:2xH100-80GB", "--telemetry-interval", "1")
    s.cli("department", "create", "research", "--deserved-gpus", "2")
    s.cli("project", "create", "vision", "--department", "research", "--deserved-gpus", "2")
    s.cli("submit", "-p", "vision", "--name", "train", "--gpu", "0.5", "--cpu", "0.5", "--", "sh", "-c", TRAIN)
    s.wait_state("train", "running")

    page = admin_page(browser, s.url, s.admin_token)
    expect(page.locator("tr[data-name=train] td.owner")).to_have_text("admin")
    page.locator("tr[data-name=train] a.wl-link").click()
    expect(page).to_have_url(f"{s.url}/#/workloads/vision/train")
    expect(page.locator("#wl-state")).to_have_text("running")
    summary = page.locator("#wl-summary")
    expect(summary.locator("tr", has_text="Owner").locator("td")).to_have_text("admin")
    expect(summary.locator("tr", has_text="GPUs").locator("td")).to_have_text("0.5 GPU")
    expect(summary.locator("tr", has_text="CPU").locator("td")).to_have_text("0.5 cores")
    expect(page.locator("#wl-allocations tbody tr")).to_have_count(1)
    expect(page.locator("#wl-allocations tbody td").nth(2)).to_have_text("GPU 0 (50%, 40.0 GiB)")
    expect(page.locator("#wl-events tbody tr").first).to_be_visible()
    # Two uPlot charts, and each takes the live samples as the page polls.
    expect(page.locator("#wl-charts .uplot canvas")).to_have_count(2)
    expect(page.locator("#util-chart")).to_have_attribute("data-points", re.compile(r"^([2-9]|\d\d+)$"), timeout=20_000)
    expect(page.locator("#memory-chart")).to_have_attribute("data-last", re.compile(r"^\d+$"))
    # The log, followed: what the job prints later arrives without a reload.
    expect(page.locator("#logs")).to_contain_text("step 0")
    expect(page.locator("#logs")).to_contain_text("step 12", timeout=20_000)
    shot(page, "13-workload-page")

    answers: list[str] = []

    def answer(d: Dialog, accept: bool) -> None:
        answers.append(d.message)
        d.accept() if accept else d.dismiss()

    page.once("dialog", lambda d: answer(d, False))
    page.locator("#wl-actions [data-action=cancel]").click()
    expect(page.locator("#wl-state")).to_have_text("running")
    page.once("dialog", lambda d: answer(d, True))
    page.locator("#wl-actions [data-action=cancel]").click()
    expect(page.locator("#wl-state")).to_have_text("cancelled", timeout=30_000)
    assert answers == ["Cancel train? Its processes are stopped."] * 2
    expect(page.locator("#wl-actions [data-action=rerun]")).to_be_visible()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_new_tab_stays_signed_in_and_signing_out_clears_the_cookies(
    make_server: Callable[..., Server], browser: Browser
) -> None:
    s = make_server("fake:1xH100-80GB")
    s.json("user", "create", "ana")
    url = f"{s.url}/api/v1/users/ana/password"
    httpx.put(url, json={"password": "correct horse"}, headers={"Authorization": f"Bearer {s.admin_token}"})
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    test_portal._sign_in(page, s, "ana", "correct horse")
    assert page.evaluate("Object.keys(sessionStorage).length + Object.keys(localStorage).length") == 0
    cookies = {c["name"]: c for c in context.cookies()}
    assert (cookies["gpupool_session"]["httpOnly"], cookies["gpupool_csrf"]["httpOnly"]) == (True, False)
    assert page.evaluate("document.cookie.includes('gpupool_session')") is False  # no script reads the session

    tab = context.new_page()
    tab.goto(s.url + "/#/costs")
    expect(tab.locator("#who")).to_have_text("ana (member)")
    expect(tab.locator("#costs")).to_contain_text("total")
    tab.click("#signout")
    expect(tab.locator("#pw")).to_be_visible()
    assert {c["name"] for c in context.cookies()} == set()
    page.reload()
    expect(page.locator("#pw")).to_be_visible()
    context.close()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_batch_sweep_submits_one_trial_per_value(make_server: Callable[..., Server], browser: Browser) -> None:
    s = make_server("fake:1xH100-80GB")
    s.cli("department", "create", "research", "--deserved-gpus", "1")
    s.cli("project", "create", "vision", "--department", "research", "--deserved-gpus", "1")
    page = admin_page(browser, s.url, s.admin_token)
    page.click("[data-template=batch]")
    form = page.locator("#submit")
    form.locator("[name=name]").fill("lr")
    form.locator("[name=amount]").fill("0.1")
    form.locator("[name=command]").fill("echo training --lr {value}")
    form.locator("[name=values]").fill("0.1, 0.01, it's")
    form.get_by_role("button", name="Submit").click()
    # Three submits, then the list: more than expect's 5 s on a loaded machine (a CI run timed out there).
    expect(page.locator("#list tbody tr")).to_have_count(3, timeout=30_000)
    made = {w["name"]: w for w in s.json("list")}
    assert sorted(made) == ["lr-0", "lr-1", "lr-2"]
    commands = [s.workload(n)["command"][2] for n in ("lr-0", "lr-1", "lr-2")]
    assert commands == ["echo training --lr '0.1'", "echo training --lr '0.01'", "echo training --lr 'it'\\''s'"]
    assert s.workload("lr-2")["env"] == {"SWEEP_INDEX": "2", "SWEEP_VALUE": "it's"}
    s.wait_state("lr-2", "succeeded", "pending", "running")
    page.click("nav a[data-page=all]")  # the filter by user is All workloads' (My workloads are one's own)
    page.locator("#filters [name=state]").select_option("pending")
    page.locator("#filters [name=user]").fill("nobody")
    expect(page.locator("#list tbody tr")).to_have_count(0)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_finished_workloads_file_downloads_from_its_page(
    make_server: Callable[..., Server], browser: Browser
) -> None:
    s = make_server("fake:1xH100-80GB")
    s.cli("department", "create", "research", "--deserved-gpus", "1")
    s.cli("project", "create", "vision", "--department", "research", "--deserved-gpus", "1")
    s.cli(
        "submit", "-p", "vision", "--name", "eval", "--gpu", "0.5", "--", "sh", "-c", "mkdir out; echo 0.93 > out/acc"
    )
    s.wait_state("eval", "succeeded")
    page = admin_page(browser, s.url, s.admin_token)
    page.goto(f"{s.url}/#/workloads/vision/eval")
    expect(page.locator("#wl-state")).to_have_text("succeeded")
    page.locator("#file-list tr[data-path=out] a", has_text="out/").click()
    row = page.locator("#file-list tr[data-path='out/acc']")
    expect(row.locator("td").nth(1)).to_have_text("5 B")
    with page.expect_download() as caught:
        row.locator("a.download").click()
    download = caught.value
    assert (download.suggested_filename, Path(download.path()).read_text()) == ("acc", "0.93\n")
    shot(page, "14-workload-files")
