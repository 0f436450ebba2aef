"""A server restarted with an empty data dir against the same store (real processes, SQLite outside the data
dir and PostgreSQL): sessions it signed stay valid, a single sign-on begun before the restart finishes after
it, and the first start does not come again."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Server
from tests.e2e.postgres import Postgres
from tests.oidc.dex import WEB_CLIENT, WEB_SECRET, Browser, Dex

PASSWORD = "correct horse battery"


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"  # outside the data dir, which the test empties
    pg: Postgres = request.getfixturevalue("postgres")
    return pg.new_database()


def test_a_restart_with_an_empty_data_dir_keeps_sessions_and_does_not_bootstrap_again(
    tmp_path: Path, store: str, start_dex: Callable[..., Dex]
) -> None:
    root = tmp_path / "server"
    root.mkdir()
    s = Server(root, store, "fake:1xH100-80GB", ())
    dex = start_dex(web_redirects=(f"{s.url}/api/v1/sso/callback",), path="")
    secret = root / "oidc-secret"
    secret.write_text(WEB_SECRET + "\n")
    secret.chmod(0o600)
    s.args = ("--single-user", "--oidc-issuer", dex.issuer, "--oidc-client-id", WEB_CLIENT,
              "--oidc-client-secret-file", str(secret), "--oidc-role", "vision-team=admin")  # fmt: skip
    try:
        s.start()
        s.cli("user", "password", "admin", "--password", PASSWORD)  # the first admin's token is used: over
        with httpx.Client(base_url=s.url, timeout=10.0) as web:
            r = web.post("/api/v1/login", json={"name": "admin", "password": PASSWORD})
            assert r.status_code == 200, r.text
            session = r.json()["token"]
            assert r.cookies["gpupool_session"] == session
            r = web.get("/api/v1/sso/login")  # signed with the session key; the browser keeps it
            assert r.status_code == 302 and r.headers["location"].startswith(f"{dex.issuer}/auth?"), r.text
            at_dex = r.headers["location"]

            s.kill()
            shutil.rmtree(s.data_dir)
            s.start()

            assert sorted(p.name for p in s.data_dir.iterdir() if p.is_file()) == []
            assert s.log().count("first start") == 1
            r = web.get("/api/v1/whoami", headers={"Authorization": f"Bearer {session}"})
            assert (r.status_code, r.json()["name"]) == (200, "admin")
            browser = Browser(dex.issuer, connector="local", email="alice@example.com")
            try:
                back = browser.go(at_dex)
            finally:
                browser.close()
            r = web.get(back)  # the callback reads the login cookie the server signed before its restart
            assert (r.status_code, r.headers["location"]) == (303, "/#/sso"), r.text
            r = web.post("/api/v1/sso/session")
            assert (r.status_code, r.json()["name"]) == (200, "alice"), r.text
    finally:
        s.kill()
