"""Single sign-on end to end: a real gpupool server process signs people in through a real Dex, in chromium
(the portal), through a scripted browser (the callback's refusals, the role map re-applied), and with the CLI's
device flow."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect, sync_playwright

from tests.e2e.conftest import GPUPOOL, Server, free_port, which_or_fail
from tests.oidc.dex import PASSWORD, WEB_CLIENT, WEB_SECRET, Browser, Dex

SHOTS = Path(__file__).resolve().parents[2] / ".artifacts" / "portal"


class Site:
    """One gpupool server and the Dex it signs in with (whose web client names the server's callback)."""

    def __init__(self, root: Path, start_dex: Callable[..., Dex]) -> None:
        self.server = Server(root, None, "fake:1xH100-80GB", ())
        self.dex = start_dex(web_redirects=(f"{self.server.url}/api/v1/sso/callback",), path="")
        self.secret = root / "oidc-secret"
        self.secret.write_text(WEB_SECRET + "\n")
        self.secret.chmod(0o600)

    def start(self, *roles: str) -> Server:
        """(Re)start the server with this role map; same port, same data dir."""
        s = self.server
        s.kill()
        s.args = ("--single-user", *self.oidc_args(), *[a for r in roles for a in ("--oidc-role", r)])
        return s.start()

    def oidc_args(self) -> tuple[str, ...]:
        return ("--oidc-issuer", self.dex.issuer, "--oidc-client-id", WEB_CLIENT,
                "--oidc-client-secret-file", str(self.secret))  # fmt: skip

    def org(self) -> None:
        s = self.server
        s.cli("department", "create", "research", "--deserved-gpus", "1")
        s.cli("project", "create", "vision", "--department", "research", "--deserved-gpus", "0.5")
        s.cli("project", "create", "nlp", "--department", "research", "--deserved-gpus", "0.5")

    def users(self) -> list[str]:
        return sorted(u["name"] for u in self.server.json("user", "list"))

    def sign_in(self, connector: str = "local", email: str | None = None) -> tuple[str, dict[str, Any] | None]:
        """A scripted browser signs in: where the callback sends it, and the session the portal would get."""
        with httpx.Client(base_url=self.server.url, timeout=10.0) as web:
            r = web.get("/api/v1/sso/login")
            assert r.status_code == 302 and r.headers["location"].startswith(f"{self.dex.issuer}/auth?"), r.text
            browser = Browser(self.dex.issuer, connector=connector, email=email)
            try:
                back = browser.go(r.headers["location"])
            finally:
                browser.close()
            assert back.startswith(f"{self.server.url}/api/v1/sso/callback?"), back
            r = web.get(back)
            assert r.status_code == 303, r.text
            where = r.headers["location"]
            if where != "/#/sso":
                assert "gpupool_session" not in r.headers.get("set-cookie", "")
                return where, None
            got = web.post("/api/v1/sso/session")
            assert got.status_code == 200 and got.headers["cache-control"] == "no-store", got.text
            again = web.post("/api/v1/sso/session")  # the hand-off cookie was one-time
            assert again.status_code == 401, again.text
            return where, dict(got.json())


@pytest.fixture
def site(tmp_path: Path, start_dex: Callable[..., Dex]) -> Iterator[Site]:
    root = tmp_path / "server"
    root.mkdir()
    s = Site(root, start_dex)
    try:
        yield s
    finally:
        s.server.kill()


def _whoami(s: Server, token: str) -> dict[str, Any]:
    r = httpx.get(f"{s.url}/api/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    return dict(r.json())


def _dex_login(page: Page, email: str) -> None:
    page.locator("a[href*='/auth/local']").first.click()
    page.fill("input[name=login]", email)
    page.fill("input[name=password]", PASSWORD)
    page.locator("#submit-login").click()
    page.locator("button[type=submit]", has_text="Grant Access").click()


def test_the_portal_signs_alice_in_through_dex_and_refuses_an_unmapped_user(site: Site) -> None:
    s = site.start("vision-team=project:vision:member")
    site.org()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=which_or_fail("chromium"), args=["--no-sandbox"])
        try:
            page = b.new_page(viewport={"width": 1280, "height": 900})
            page.goto(s.url + "/")
            page.get_by_role("button", name="Sign in with single sign-on").click()
            expect(page).to_have_url(re.compile(re.escape(site.dex.issuer)))
            _dex_login(page, "alice@example.com")
            expect(page.locator("#who")).to_have_text("alice (member)")
            expect(page).to_have_url(f"{s.url}/#/workloads")
            expect(page.locator("#list")).to_be_visible()
            expect(page.locator("[data-template=notebook]")).to_be_visible()
            page.click("[data-template=notebook]")
            expect(page.locator("#submit [name=project] option")).to_have_text(["vision"])
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / "7-sso-signed-in.png"), full_page=True)
            cookies = {c["name"]: c for c in page.context.cookies()}
            token = cookies["gpupool_session"]["value"]
            assert token.startswith("gps_")
            assert _whoami(s, token)["projects"] == ["vision"]
            assert cookies["gpupool_session"]["path"] == "/" and cookies["gpupool_session"]["httpOnly"]
            assert "gpupool_sso_session" not in cookies and "gpupool_sso_login" not in cookies

            other = b.new_context(viewport={"width": 1280, "height": 900}).new_page()
            other.goto(s.url + "/")
            other.get_by_role("button", name="Sign in with single sign-on").click()
            other.locator("a[href*='/auth/mock']").first.click()  # Kilgore Trout, of the group 'authors' only
            other.locator("button[type=submit]", has_text="Grant Access").click()
            expect(other.locator("#err")).to_have_text(
                "Single sign-on failed: your groups give you no access to gpupool."
            )
            expect(other.locator("#pw")).to_be_visible()
            assert "gpupool_session" not in {c["name"] for c in other.context.cookies()}
            other.screenshot(path=str(SHOTS / "8-sso-refused.png"), full_page=True)
        finally:
            b.close()
    assert site.users() == ["admin", "alice"]  # nobody was made for the refused login
    signed = [(a["actor"], a["action"], a["status"]) for a in s.json("audit", "list", "--actor", "alice")]
    assert ("alice", "GET /api/v1/sso/callback", 303) in signed


def test_without_sso_the_routes_say_it_is_not_configured(tmp_path: Path) -> None:
    root = tmp_path / "plain"
    root.mkdir()
    s = Server(root, None, "fake:1xH100-80GB", ("--single-user",)).start()
    try:
        assert httpx.get(f"{s.url}/api/v1/sso/config").json() == {"enabled": False}
        r = httpx.get(f"{s.url}/api/v1/sso/login")
        assert (r.status_code, r.json()) == (404, {"detail": "single sign-on is not configured"})
    finally:
        s.kill()


def test_an_unverified_email_is_refused_and_makes_no_user(site: Site) -> None:
    site.start("vision-team=project:vision:member", "ml-admins=admin", "bobs=admin")
    where, session = site.sign_in(email="bob@example.com")
    assert (where, session) == ("/#/login?sso_error=email_unverified", None)
    assert site.users() == ["admin"]


def test_a_second_login_is_the_same_user_and_the_map_is_applied_again(site: Site) -> None:
    s = site.start("vision-team=project:vision:member", "nobody=project:ghost:member")
    site.org()
    s.cli("user", "create", "alice", "--project", "nlp")  # a password user already has the name: not hers
    where, first = site.sign_in(email="alice@example.com")
    assert where == "/#/sso" and first is not None
    assert (first["name"], first["role"]) == ("alice-2", "member")
    me = _whoami(s, first["token"])
    assert (me["name"], me["projects"], me["departments"]) == ("alice-2", ["vision"], [])
    assert "project 'ghost', which does not exist; skipped" not in s.log()  # alice is not in 'nobody'

    s = site.start(
        "vision-team=department:research:viewer", "ml-admins=project:nlp:member", "vision-team=project:ghost:admin"
    )
    where, second = site.sign_in(email="alice@example.com")
    assert where == "/#/sso" and second is not None
    assert (second["name"], second["role"]) == ("alice-2", "member")
    assert site.users() == ["admin", "alice", "alice-2"]
    members = {q: {m["user"]: m["role"] for m in s.json("member", "list", q)} for q in ("vision", "nlp")}
    assert members == {"vision": {"alice-2": "viewer"}, "nlp": {"alice": "member", "alice-2": "member"}}
    assert "the role map names the project 'ghost', which does not exist; skipped" in s.log()

    s = site.start("vision-team=department:research:admin", "ml-admins=admin")
    where, third = site.sign_in(email="alice@example.com")
    assert third is not None and (third["name"], third["role"]) == ("alice-2", "admin")
    assert _whoami(s, third["token"])["departments"] == ["research"]

    s = site.start("other-group=admin")  # the provider took everything away: she is refused, and keeps nothing
    where, fourth = site.sign_in(email="alice@example.com")
    assert (where, fourth) == ("/#/login?sso_error=no_access", None)
    assert _whoami(s, third["token"])["role"] == "member" and _whoami(s, third["token"])["projects"] == []


def test_a_disabled_user_is_refused_whatever_the_providers_groups_say_until_enabled(site: Site) -> None:
    s = site.start("vision-team=project:vision:member")
    site.org()
    where, first = site.sign_in(email="alice@example.com")
    assert where == "/#/sso" and first is not None
    name = first["name"]
    s.cli("user", "disable", name)
    assert _whoami_status(s, first["token"]) == 401  # the session it had is refused at once
    where, refused = site.sign_in(email="alice@example.com")
    assert (where, refused) == ("/#/login?sso_error=disabled", None)
    s.cli("user", "enable", name)
    where, again = site.sign_in(email="alice@example.com")
    assert where == "/#/sso" and again is not None and again["name"] == name


def _whoami_status(s: Server, token: str) -> int:
    return httpx.get(f"{s.url}/api/v1/whoami", headers={"Authorization": f"Bearer {token}"}, timeout=10).status_code


def _cli_login(site: Site, env: dict[str, str], **person: Any) -> tuple[int, str, str]:
    """`gpupool login --sso` in a subprocess; the person opens the URL it prints and approves."""
    s = site.server
    cli = subprocess.Popen(
        [GPUPOOL, "login", "--url", s.url, "--sso"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert cli.stdout is not None
        line = cli.stdout.readline()  # the CLI prints it before its first wait; EOF if it died instead
        m = re.fullmatch(r"open (\S+) \(code ([A-Z0-9]{4}-[A-Z0-9]{4})\)\n", line)
        assert m is not None, (line, cli.stderr.read() if cli.poll() is not None and cli.stderr else "")
        assert m.group(1) == f"{site.dex.issuer}/device?user_code={m.group(2)}"
        browser = Browser(site.dex.issuer, **person)
        try:
            browser.go(m.group(1))
            assert "Login Successful" in browser.pages[-1]
        finally:
            browser.close()
        out, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    return cli.returncode, out, err


def test_the_cli_logs_in_with_the_device_flow(site: Site) -> None:
    s = site.start("vision-team=project:vision:member")
    site.org()
    # The server polls the provider at most once an interval for a handle.
    start = httpx.post(f"{s.url}/api/v1/sso/device").json()
    assert set(start) == {"handle", "user_code", "verification_uri", "verification_uri_complete", "interval",
                          "expires_in"}  # fmt: skip
    early = httpx.post(f"{s.url}/api/v1/sso/device/{start['handle']}")
    assert early.status_code == 429 and "poll at most every 5 s" in early.json()["detail"]
    assert httpx.post(f"{s.url}/api/v1/sso/device/{'x' * 43}").status_code == 410

    env = {k: v for k, v in s.env.items() if k not in ("GPUPOOL_URL", "GPUPOOL_TOKEN")}
    rc, out, err = _cli_login(site, env, connector="local", email="alice@example.com")
    assert rc == 0, err
    assert out.splitlines()[-1].startswith(f"logged in to {s.url} as alice (member); saved in ")
    who = subprocess.run([GPUPOOL, "whoami"], env=env, capture_output=True, text=True, timeout=60)
    assert (who.returncode, who.stdout) == (0, "alice (member); projects: vision\n")


def test_the_cli_device_flow_refuses_a_user_whose_groups_map_to_nothing(site: Site) -> None:
    s = site.start("vision-team=project:vision:member")
    site.org()
    env = {k: v for k, v in s.env.items() if k not in ("GPUPOOL_URL", "GPUPOOL_TOKEN")}
    rc, out, err = _cli_login(site, env, connector="mock")  # Kilgore Trout, of 'authors' only
    assert (rc, out, err) == (1, "", "error: single sign-on refused: your groups give you no access to gpupool\n")
    assert site.users() == ["admin"]
    assert not (Path(env["XDG_CONFIG_HOME"]) / "gpupool" / "config.json").exists()


def test_bad_sso_settings_stop_the_start_with_a_clear_error(tmp_path: Path) -> None:
    loose = tmp_path / "loose-secret"
    loose.write_text("s3cret\n")
    loose.chmod(0o644)
    base = [GPUPOOL, "server", "--data-dir", str(tmp_path / "d"), "--port", str(free_port()), "--single-user",
            "--gpus", "fake:1xH100-80GB", "--oidc-issuer", "http://127.0.0.1:9/dex",
            "--oidc-client-id", "gpupool"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    cases = {
        ("--oidc-role", "vision-team=project:Vision:member"): "is not a project name",
        ("--oidc-role", "vision-team=owner"): "after '=' comes admin, department:NAME:ROLE or project:NAME:ROLE",
        ("--oidc-client-secret-file", str(tmp_path / "missing")): "--oidc-client-secret-file",
        ("--oidc-client-secret-file", str(loose)): "mode 644 lets others read it; chmod 600 it",
    }
    for extra, says in cases.items():
        done = subprocess.run([*base, *extra], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and says in done.stderr, (extra, done.stderr)
        assert "Traceback" not in done.stderr
