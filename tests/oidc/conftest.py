"""A real Dex for the OIDC tests (one for the session, more on demand), clients of it, and a login helper."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from gpupool.services.oidc import LoginStart, OidcClient, OidcConfig
from tests.oidc.dex import REDIRECT, WEB_CLIENT, WEB_SECRET, Browser, Dex, binary


@pytest.fixture(scope="session")
def dex_exe() -> Path:
    return binary()


class _Dexes:
    def __init__(self, exe: Path) -> None:
        self.exe = exe
        self.started: list[tuple[Dex, Path]] = []

    def start(self, **options: Any) -> Dex:
        root = Path(tempfile.mkdtemp(prefix="gpupool-dex-"))
        d = Dex(root, self.exe, **options)
        self.started.append((d, root))
        return d.start()

    def stop(self) -> None:
        for d, root in self.started:
            d.stop()
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def dex(dex_exe: Path) -> Iterator[Dex]:
    dexes = _Dexes(dex_exe)
    try:
        yield dexes.start()
    finally:
        dexes.stop()


@pytest.fixture
def start_dex(dex_exe: Path) -> Iterator[Callable[..., Dex]]:
    """Another Dex, with its own options (storage, expiry), stopped after the test."""
    dexes = _Dexes(dex_exe)
    try:
        yield dexes.start
    finally:
        dexes.stop()


def client_for(dex: Dex, client_id: str = WEB_CLIENT, secret: str | None = WEB_SECRET, **kw: Any) -> OidcClient:
    redirect = kw.pop("redirect_uri", REDIRECT)
    return OidcClient(
        OidcConfig(issuer=dex.issuer, client_id=client_id, client_secret=secret, redirect_uri=redirect, **kw)
    )


@pytest.fixture
def web(dex: Dex) -> Iterator[OidcClient]:
    with client_for(dex) as c:
        yield c


@dataclass
class Callback:
    """What the app's callback received, and what begin_login gave it to keep."""

    start: LoginStart
    code: str
    state: str


def log_in(client: OidcClient, dex: Dex, *, connector: str = "local", email: str | None = None) -> Callback:
    """begin_login, then a person in a browser logs in at Dex and is sent back to the app's redirect URI."""
    start = client.begin_login()
    browser = Browser(dex.issuer, connector=connector, email=email)
    try:
        url = browser.go(start.authorize_url)
    finally:
        browser.close()
    assert url.startswith(client.config.redirect_uri + "?"), url
    query = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    return Callback(start, query["code"], query["state"])
