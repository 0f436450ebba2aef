"""Apps on an origin of their own, in a real browser: with apps_url set, an app opened from the portal is served
on the apps host, and a tenant's script on its page cannot call the API as the user viewing it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, expect

from tests.e2e.conftest import Server
from tests.e2e.test_portal import admin_page, shot

PAGE = "<!doctype html><title>tenant app</title><h1 id=hello>hello from the tenant</h1>\n"
ATTACK = """async (main) => {
  const out = {cookies: document.cookie.split("; ").filter((c) => c.startsWith("gpupool"))};
  try { out.read = (await fetch(main + "/api/v1/whoami", {credentials: "include"})).status; }
  catch (e) { out.read = "blocked"; }
  // A simple request goes without a preflight; the browser hides the answer, the server must refuse it.
  await fetch(main + "/api/v1/users", {method: "POST", mode: "no-cors", credentials: "include",
    headers: {"Content-Type": "text/plain"}, body: JSON.stringify({name: "intruder", role: "admin"})});
  try { out.write = (await fetch(main + "/api/v1/users", {method: "POST", credentials: "include",
    headers: {"Content-Type": "application/json", "X-CSRF-Token": "guess"},
    body: JSON.stringify({name: "intruder2", role: "admin"})})).status; }
  catch (e) { out.write = "blocked"; }
  out.here = (await fetch("/api/v1/whoami", {credentials: "include"})).status;
  return out;
}"""


@pytest.fixture
def apps_server(tmp_path: Path) -> Iterator[Server]:
    root = tmp_path / "server"
    root.mkdir()
    s = Server(root, None, "fake:2xH100-80GB", ())
    s.env["GPUPOOL_APPS_URL"] = f"http://apps.localhost:{s.port}"
    try:
        yield s.start()
    finally:
        s.kill()
        s.stop_workloads()


def test_an_app_opened_from_the_portal_runs_on_its_own_origin_and_cannot_call_the_api(
    apps_server: Server, browser: Browser
) -> None:
    s = apps_server
    s.cli("project", "create", "lab", "--deserved-gpus", "2")
    s.cli("project", "set", "lab", "--production-allowed")
    ana = s.json("user", "create", "ana", "--project", "lab")["token"]
    (s.cwd / "index.html").write_text(PAGE)
    s.cli("submit", "-p", "lab", "--type", "inference", "--name", "web", "--", "sh", "-c",
          'exec python3 -m http.server "$PORT" --bind 127.0.0.1', token=ana)  # fmt: skip
    s.cli("submit", "-p", "lab", "--type", "notebook", "--name", "nb", "--gpu", "0.25", "--no-code", token=ana)
    s.wait_state("web", "running", timeout=120)
    s.wait_state("nb", "running", timeout=120)

    # The admin, signed in to the portal, opens the tenant's app: it lands on the apps host, signed in there.
    page = admin_page(browser, s.url, s.admin_token)
    page.click("nav a[data-page=all]")  # ana's, not the admin's own
    row = page.locator("tr[data-name=web]")
    expect(row.locator(".state")).to_have_text("running", timeout=30_000)
    with page.expect_popup() as popup:
        row.get_by_role("button", name="Open").click()
    app = popup.value
    expect(app.locator("#hello")).to_have_text("hello from the tenant", timeout=30_000)
    assert app.url == f"http://apps.localhost:{s.port}/apps/lab/web/"
    shot(app, "apps-origin")
    names = {c["name"]: c for c in app.context.cookies(f"http://apps.localhost:{s.port}/apps/lab/web/")}
    assert sorted(names) == ["gpupool_app"] and names["gpupool_app"]["httpOnly"] is True

    # The tenant's script, as the admin views it: nothing of the admin's to read, nothing it can change.
    got = app.evaluate(ATTACK, s.url)
    assert got == {"cookies": [], "read": "blocked", "write": "blocked", "here": 404}
    users = httpx.get(f"{s.url}/api/v1/users", headers={"Authorization": f"Bearer {s.admin_token}"}).json()
    assert [u["name"] for u in users if u["name"].startswith("intruder")] == []
    app.close()

    # A notebook works there as on the portal's origin: JupyterLab, a kernel, its websocket.
    with page.expect_popup() as popup:
        page.locator("tr[data-name=nb]").get_by_role("button", name="Open").click()
    lab = popup.value
    expect(lab.locator(".jp-Launcher")).to_be_visible(timeout=60_000)
    assert lab.url.startswith(f"http://apps.localhost:{s.port}/apps/lab/nb/lab")
    lab.locator(".jp-LauncherCard[data-category=Notebook]").first.click()
    expect(lab.locator(".jp-StatusBar-Widget").filter(has_text="Idle").first).to_be_visible(timeout=60_000)
    cell = lab.locator(".jp-Notebook .jp-Cell .cm-content").first
    cell.click()
    cell.type("print(6 * 7)")
    lab.keyboard.press("Shift+Enter")
    expect(lab.locator(".jp-OutputArea-output").first).to_have_text("42", timeout=60_000)
    shot(lab, "apps-origin-notebook")
    assert lab.evaluate(ATTACK, s.url) == {"cookies": [], "read": "blocked", "write": "blocked", "here": 404}
    # The admin's portal is still signed in, in its own tab.
    page.reload()
    expect(page.locator("#who")).to_contain_text("admin")
