"""A real OpenID Connect provider for the tests: Dex (built from the Go module proxy by scripts/build-dex), with a
static config in a temp dir, bound to 127.0.0.1 only. And a minimal browser that walks Dex's HTML pages the way a
person would: pick a connector, fill in the login form, approve, follow the redirects."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import httpx
import yaml

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "password"
# bcrypt (cost 10) of "password": the hash Dex's own development config ships for its example user.
PASSWORD_HASH = "$2a$10$2b2cU8CPhOTaGrs1HRQuAueS7JTT5ZHsHSzYiFPm1leZck7Mc8T4W"
WEB_CLIENT, WEB_SECRET = "gpupool", "gpupool-test-secret-0123456789abcdef"
OTHER_CLIENT, OTHER_SECRET = "other-app", "other-app-secret"
CLI_CLIENT = "gpupool-cli"  # public: no secret, PKCE only
REDIRECT = "http://127.0.0.1:9/oidc/callback"  # never served: the browser stops at it, as the app would receive it
OTHER_REDIRECT = "http://127.0.0.1:9/other/callback"

USERS = [
    {  # groups from the static password database (Dex 2.45 takes them there)
        "email": "alice@example.com",
        "name": "Alice Example",
        "username": "alice",
        "userID": "alice-0001",
        "groups": ["ml-admins", "vision-team"],
    },
    {
        "email": "bob@example.com",
        "name": "Bob Unverified",
        "username": "bob",
        "userID": "bob-0002",
        "emailVerified": False,
    },
]


def binary() -> Path:
    done = subprocess.run([str(REPO / "scripts" / "build-dex")], capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/build-dex failed: {done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Dex:
    def __init__(
        self,
        root: Path,
        exe: Path,
        *,
        storage: dict[str, Any] | None = None,
        expiry: dict[str, str] | None = None,
        web_redirects: tuple[str, ...] = (),
        path: str = "/dex",
    ) -> None:
        """`web_redirects`: more redirect URIs for the web client (a gpupool server's SSO callback); with any,
        the web client may use the device flow too: Dex wants its device callback named for a confidential
        client, and sends the browser to that name as it is, '/device/callback' on the host, so the device flow
        of a confidential client works only with an issuer at the root (`path=""`)."""
        self.root, self.exe = root, exe
        self.port = _port()
        self.issuer = f"http://127.0.0.1:{self.port}{path}"
        self.storage = storage or {"type": "memory"}
        self.expiry = expiry or {}
        self.web_redirects = [*web_redirects, "/device/callback"] if web_redirects else []
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def redirects(self) -> list[str]:
        return [REDIRECT, *self.web_redirects]

    def config(self) -> dict[str, Any]:
        return {
            "issuer": self.issuer,
            "storage": self.storage,
            "web": {"http": f"127.0.0.1:{self.port}"},
            "logger": {"level": "info"},
            "expiry": self.expiry,
            "oauth2": {"skipApprovalScreen": False},
            "enablePasswordDB": True,
            "staticPasswords": [{**u, "hash": PASSWORD_HASH} for u in USERS],
            "connectors": [{"type": "mockCallback", "id": "mock", "name": "Mock"}],
            "staticClients": [
                {"id": WEB_CLIENT, "secret": WEB_SECRET, "name": "gpupool", "redirectURIs": self.redirects},
                {"id": OTHER_CLIENT, "secret": OTHER_SECRET, "name": "Other", "redirectURIs": [OTHER_REDIRECT]},
                {"id": CLI_CLIENT, "name": "gpupool CLI", "public": True},
            ],
        }

    def start(self, deadline_s: float = 60.0) -> Dex:
        cfg = self.root / "config.yaml"
        cfg.write_text(yaml.safe_dump(self.config()))
        log = open(self.root / "dex.log", "wb")  # noqa: SIM115 - kept for the process's life
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root)}
        self.proc = subprocess.Popen(
            [str(self.exe), "serve", str(cfg)], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        deadline = time.monotonic() + deadline_s
        with httpx.Client(timeout=2.0) as http:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"dex exited {self.proc.returncode}: {self.log()[-3000:]}")
                try:
                    doc = http.get(f"{self.issuer}/.well-known/openid-configuration").json()
                    if http.get(doc["jwks_uri"]).json().get("keys"):  # serving, and its signing key is made
                        return self
                except (httpx.HTTPError, ValueError, KeyError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"dex did not answer within {deadline_s} s: {self.log()[-3000:]}")
                time.sleep(0.05)  # a poll's pace, not a synchronisation: the loop waits on the answer

    def log(self) -> str:
        path = self.root / "dex.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


class _Page(HTMLParser):
    """The forms (action, inputs) and links of one HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[tuple[str | None, dict[str, str]]] = []
        self.links: list[str] = []
        self._form: tuple[str | None, dict[str, str]] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "form":
            self._form = (a.get("action"), {})
            self.forms.append(self._form)
        elif tag == "input" and self._form is not None and a.get("name"):
            self._form[1][str(a["name"])] = a.get("value") or ""
        elif tag == "a" and a.get("href"):
            self.links.append(str(a["href"]))

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._form = None


class Browser:
    """Follows redirects and cookies, and on each Dex page does what a person would: chooses the connector,
    types the email and password, presses Approve. Stops at a redirect that leaves Dex (the app's callback) or
    at a page that asks nothing more (the device flow's success page)."""

    def __init__(
        self,
        issuer: str,
        *,
        connector: str,
        email: str | None = None,
        password: str = PASSWORD,
        user_code: str | None = None,
    ) -> None:
        self.issuer, self.connector, self.email, self.password = issuer, connector, email, password
        self.user_code = user_code  # what the person types on the device page (else the code the URL carried)
        self.codes_entered = 0
        self.http = httpx.Client(timeout=10.0, follow_redirects=False)
        self.pages: list[str] = []

    def close(self) -> None:
        self.http.close()

    def go(self, url: str, *, method: str = "GET", data: dict[str, str] | None = None) -> str:
        """The URL the provider finally sends the browser to outside itself, or the last page's URL."""
        for _ in range(20):
            r = self.http.request(method, url, data=data)
            if r.is_redirect:
                url, method, data = urljoin(url, r.headers["location"]), "GET", None
                if not url.startswith(self.issuer):
                    return url
                continue
            self.pages.append(r.text)
            if r.status_code != 200:  # an error page: a person reads it and stops (the test checks what it says)
                return url
            page = _Page()
            page.feed(r.text)
            step = self._next(url, page)
            if step is None:
                return url
            url, method, data = step
        raise AssertionError("too many steps")

    def _next(self, url: str, page: _Page) -> tuple[str, str, dict[str, str] | None] | None:
        for action, inputs in page.forms:
            target = urljoin(url, action or url)
            if "login" in inputs and "password" in inputs:
                assert self.email, "Dex asks for a password, but this browser has no user"
                return target, "POST", {**inputs, "login": self.email, "password": self.password}
            if inputs.get("approval") == "approve":
                return target, "POST", inputs
            if "user_code" in inputs:
                if self.codes_entered:  # the code was refused: a person would stop and read the page
                    return None
                self.codes_entered += 1
                return target, "POST", {**inputs, "user_code": self.user_code or inputs["user_code"]}
        for href in page.links:
            if f"/auth/{self.connector}" in href:
                return urljoin(url, href), "GET", None
        return None
