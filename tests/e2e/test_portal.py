"""The portal in a real browser (Playwright driving Debian's chromium) against a real server.

Screenshots of every page go to .artifacts/portal/ in the repository.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from tests.e2e.conftest import Server

SHOTS = Path(__file__).resolve().parents[2] / ".artifacts" / "portal"


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def _sign_in(page: Page, s: Server, name: str, password: str) -> None:
    page.goto(s.url + "/")
    page.fill("#pw [name=name]", name)
    page.fill("#pw [name=password]", password)
    page.click("#pw button")
    expect(page.locator("#who")).to_contain_text(name)


def token_page(browser: Browser, url: str, token: str) -> Page:
    """A new page of the portal at `url` (its own cookies), signing in with `token`."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(url + "/")
    page.fill("#tok [name=token]", token)
    page.click("#tok button")
    return page


def admin_page(browser: Browser, url: str, token: str) -> Page:
    """A new page of the portal at `url`, signed in with the admin's token."""
    page = token_page(browser, url, token)
    expect(page.locator("#who")).to_contain_text("admin")
    return page


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_member_launches_opens_and_cancels_a_notebook_and_sees_only_their_projects(
    make_server: Callable[..., Server], browser: Browser
) -> None:
    s = make_server("fake:2xH100-80GB", "--telemetry-interval", "1", "--price", "default=2.5")
    s.cli("department", "create", "research", "--deserved-gpus", "1")
    s.cli("project", "create", "lab", "--department", "research", "--deserved-gpus", "0.5")
    s.cli("project", "create", "other", "--department", "research", "--deserved-gpus", "0.5")
    s.cli("project", "policy", "lab", "--idle-timeout", "notebook=30m")
    s.json("user", "create", "ana", "--project", "lab")
    bo = s.json("user", "create", "bo", "--project", "other")["token"]
    headers = {"Authorization": f"Bearer {s.admin_token}"}
    for user, password in (("ana", "correct horse"), ("bo", "battery staple")):
        url = f"{s.url}/api/v1/users/{user}/password"
        httpx.put(url, json={"password": password}, headers=headers).raise_for_status()
    s.cli("submit", "-p", "other", "--name", "secret-job", "--gpu", "0.25", "--", "sleep", "300", token=bo)

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(s.url + "/")
    page.fill("#pw [name=name]", "ana")
    page.fill("#pw [name=password]", "wrong password")
    page.click("#pw button")
    expect(page.locator("#err")).to_contain_text("wrong name or password")
    shot(page, "0-sign-in")
    _sign_in(page, s, "ana", "correct horse")

    page.click("[data-template=notebook]")
    expect(page.locator("#headroom")).to_contain_text("0.50 GPUs deserved")
    expect(page.locator("#headroom")).to_contain_text("suspended after 30 min below 5% GPU use")
    page.fill("#submit [name=name]", "my-nb")
    page.click("#submit button")
    row = page.locator("tr[data-name=my-nb]")
    expect(row.locator(".state")).to_have_text("running", timeout=90_000)
    expect(page.locator("tr[data-name=secret-job]")).to_have_count(0)  # another project's work is not there
    shot(page, "1-my-workloads")

    with page.expect_popup() as popup:
        row.get_by_role("button", name="Open").click()
    lab = popup.value
    lab.wait_for_load_state()
    # Through the server's proxy, on the sign-in's session cookie: no token in the address, no login page.
    assert lab.url.split("?")[0] == f"{s.url}/apps/lab/my-nb/lab"
    expect(lab).to_have_title(re.compile("JupyterLab"), timeout=30_000)
    expect(lab.locator(".jp-Launcher")).to_be_visible(timeout=30_000)
    kernel = lab.locator(".jp-LauncherCard[data-category=Notebook]").first
    kernel.click()  # a notebook with a live kernel: its websocket goes through the proxy too
    expect(lab.locator(".jp-StatusBar-Widget").filter(has_text="Idle").first).to_be_visible(timeout=60_000)
    cell = lab.locator(".jp-Notebook .jp-Cell .cm-content").first
    cell.click()
    cell.type("print(6 * 7)")
    expect(cell).to_have_text("print(6 * 7)")
    lab.keyboard.press("Shift+Enter")
    expect(lab.locator(".jp-OutputArea-output").first).to_have_text("42", timeout=60_000)
    shot(lab, "1b-jupyterlab")
    lab.close()

    # Another project's member, signed in, is refused the same address, and learns nothing of it.
    other = browser.new_context(viewport={"width": 1280, "height": 900})
    bo_page = other.new_page()
    _sign_in(bo_page, s, "bo", "battery staple")
    refused = bo_page.goto(f"{s.url}/apps/lab/my-nb/lab")
    assert refused is not None and refused.status == 404
    other.close()

    page.click("nav a[data-page=cluster]")
    expect(page.locator("#gpu-map")).to_contain_text("my-nb")
    expect(page.locator("#gpu-map")).to_contain_text("(another project)")
    shot(page, "2-cluster")
    page.click("nav a[data-page=quotas]")
    expect(page.locator("#quotas")).to_contain_text("lab")
    expect(page.locator("#quotas [data-queue=other]")).to_have_count(0)
    expect(page.locator("#quotas input")).to_have_count(0)  # members read; only admins edit
    shot(page, "3-quotas")
    page.click("nav a[data-page=waste]")
    expect(page.locator("#idle-now")).to_be_visible()
    # Its own work in the right-sizing report (no advice before 30 minutes of samples); another project's not.
    expect(page.locator("#rightsizing tr[data-workload='lab/my-nb'] td.advice")).to_have_text("–")
    expect(page.locator("#rightsizing tbody tr")).to_have_count(1)
    shot(page, "4-waste")
    page.click("nav a[data-page=costs]")
    expect(page.locator("#costs")).to_contain_text("total")
    expect(page.locator("#costs")).not_to_contain_text("other")
    shot(page, "5-costs")

    page.click("nav a[data-page=workloads]")
    page.once("dialog", lambda d: d.accept())  # cancel asks first
    page.locator("tr[data-name=my-nb]").get_by_role("button", name="Cancel").click()
    expect(page.locator("tr[data-name=my-nb] .state")).to_have_text("cancelled", timeout=30_000)
    session = {c["name"]: c["value"] for c in page.context.cookies()}["gpupool_session"]
    assert httpx.get(f"{s.url}/api/v1/whoami", headers={"Authorization": f"Bearer {session}"}).status_code == 200
    page.click("#signout")
    expect(page.locator("#pw")).to_be_visible()
    # Signing out ended the session on the server, not only in this tab.
    assert httpx.get(f"{s.url}/api/v1/whoami", headers={"Authorization": f"Bearer {session}"}).status_code == 401


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_admin_signs_in_with_a_token_and_edits_a_quota_in_place(
    make_server: Callable[..., Server], browser: Browser
) -> None:
    s = make_server("fake:2xH100-80GB")
    s.cli("department", "create", "research", "--deserved-gpus", "2")
    s.cli("project", "create", "lab", "--department", "research", "--deserved-gpus", "1")
    page = admin_page(browser, s.url, s.admin_token)
    page.click("nav a[data-page=quotas]")
    row = page.locator("#quotas tr[data-queue=lab]")
    row.locator("[name=deserved]").fill("1.5")
    row.get_by_role("button", name="Save").click()
    expect(row).to_have_class(re.compile("saved"))
    assert s.json("project", "list")[0]["quotas"][0]["deserved_gpus"] == 1.5
    row.locator("[name=deserved]").fill("5")
    row.get_by_role("button", name="Save").click()
    expect(page.locator("#quota-err")).to_contain_text("more than its own")
    shot(page, "6-quotas-admin")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_api_docs_render_under_the_strict_csp_with_nothing_from_outside(
    make_server: Callable[..., Server], browser: Browser
) -> None:
    s = make_server("fake:1xH100-80GB")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    refused: list[str] = []
    outside: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
    page.on("request", lambda r: outside.append(r.url) if not r.url.startswith(s.url) else None)
    page.goto(s.url + "/docs")
    expect(page.locator(".opblock-summary-path").filter(has_text="/api/v1/workloads").first).to_be_visible(
        timeout=30_000
    )
    shot(page, "7-api-docs")
    assert (refused, outside) == ([], [])
    assert httpx.get(s.url + "/redoc", follow_redirects=False).headers["location"] == "/docs"
