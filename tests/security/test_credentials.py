"""Narrow credentials never become a full login (docs/security.md, "Credentials"). Before the fix a workload's own
token (its project's members read it through exec) or a token narrowed to a viewer or to one project set its
user's first password, and /login then gave a 12-hour session with every project of that user, able to make
unrestricted tokens. Now setting a password, opening a session and making a token take the user's whole identity
(a session, or a personal token narrowed to nothing); a password is set with the current one, or by an admin.

Against a real server process (apps on an origin of their own), on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Server, wait_for
from tests.e2e.postgres import Postgres

PASSWORD, NEW = "correct horse battery", "another long password"
WEB = 'echo "$GPUPOOL_TOKEN" > token; exec python3 -m http.server "$PORT" --bind 127.0.0.1'
"""ana's inference service: it keeps its own token where the test reads it, as a member's exec would."""

# Every call that makes a credential from the one it is sent with. /login and single sign-on take no token (a
# password, or the identity provider), and /logout only ends the caller's own.
PASSWORDS, SESSIONS, TOKENS = "set passwords", "open sessions", "make tokens"
ENDPOINTS: dict[str, tuple[str, str, dict[str, Any] | None, str]] = {
    "set a first password": ("PUT", "/api/v1/users/ana/password", {"password": NEW}, PASSWORDS),
    "set another's password": ("PUT", "/api/v1/users/dee/password", {"password": NEW}, PASSWORDS),
    "make a token": ("POST", "/api/v1/tokens", {"name": "escape"}, TOKENS),
    "make a token as narrow as itself": ("POST", "/api/v1/tokens", {"name": "same", "project": "lab", "role": "viewer"},
                                         TOKENS),
    "make a service token": ("POST", "/api/v1/tokens", {"name": "ci2", "kind": "service", "project": "lab"}, TOKENS),
    "make an API key": ("POST", "/api/v1/tokens", {"name": "k", "kind": "apikey", "project": "lab", "app": "web"},
                        TOKENS),
    "open the portal's session": ("POST", "/api/v1/session", None, SESSIONS),
}  # fmt: skip
NARROWED = "a token narrowed to a project or a role cannot {}: use your own login"
REFUSALS = {
    "workload": "a workload's own token cannot {}: it ends with the workload",
    "viewer": NARROWED,
    "project": NARROWED,
    "admin-viewer": NARROWED,
    "service": "a service token cannot {}: it belongs to its project, not to a person",
}
"""Each narrow credential, and why it is refused."""


@dataclass
class World:
    s: Server
    tokens: dict[str, str]
    """Full: ana, cy, dee (people of lab); narrow: those of REFUSALS, each ana's (admin-viewer the admin's,
    cy-viewer cy's), and ana's API key."""

    def call(self, method: str, path: str, token: str | None, body: Any = None, **headers: str) -> httpx.Response:
        auth = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.request(method, self.s.url + path, json=body, headers={**auth, **headers}, timeout=30)

    def ok(self, method: str, path: str, token: str | None = None, body: Any = None) -> Any:
        r = self.call(method, path, token or self.s.admin_token, body)
        assert r.status_code < 300, (method, path, r.status_code, r.text)
        return r.json() if r.content else None

    def token(self, owner: str, body: dict[str, Any]) -> str:
        made: str = self.ok("POST", "/api/v1/tokens", self.tokens.get(owner), body)["token"]
        return made


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    db = None
    if request.param == "postgresql":
        pg: Postgres = request.getfixturevalue("postgres")
        db = pg.new_database()
    s = Server(tmp_path_factory.mktemp(f"credentials-{request.param}"), db, "fake:2xH100-80GB", ())
    s.env["GPUPOOL_APPS_URL"] = f"http://apps.localhost:{s.port}"
    s.start()
    try:
        w = World(s, {})
        w.ok("POST", "/api/v1/projects", body={"name": "lab", "deserved_gpus": 2})
        for name in ("ana", "cy", "dee"):
            w.tokens[name] = w.ok("POST", "/api/v1/users", body={"name": name, "projects": ["lab"]})["token"]
        w.ok("PUT", "/api/v1/users/cy/password", body={"password": PASSWORD})
        w.tokens["viewer"] = w.token("ana", {"name": "ro", "project": "lab", "role": "viewer"})
        w.tokens["project"] = w.token("ana", {"name": "lab-only", "project": "lab"})
        w.tokens["service"] = w.token("ana", {"name": "ci", "kind": "service", "project": "lab"})
        w.tokens["admin-viewer"] = w.token("admin", {"name": "ro", "project": "lab", "role": "viewer"})
        w.tokens["cy-viewer"] = w.token("cy", {"name": "ro", "project": "lab", "role": "viewer"})
        web = w.ok("POST", "/api/v1/workloads", w.tokens["ana"], {
            "project": "lab", "name": "web", "type": "inference", "priority": "training", "command": ["sh", "-c", WEB],
        })  # fmt: skip
        s.wait_state("web", "running", timeout=120)
        kept = s.data_dir / "workloads" / str(web["id"]) / "token"
        w.tokens["workload"] = wait_for(lambda: _read(kept), 60, "the workload's token")
        assert w.tokens["workload"].startswith("gpw_")
        w.tokens["apikey"] = w.token("ana", {"name": "key", "kind": "apikey", "project": "lab", "app": "web"})
        yield w
    finally:
        s.kill()
        s.stop_workloads()


def _read(path: Path) -> str | None:
    text = path.read_text().strip() if path.exists() else ""
    return text or None


def _token_ids(w: World) -> list[int]:
    return [t["id"] for t in w.ok("GET", "/api/v1/tokens?revoked=true")]


@pytest.mark.parametrize("credential", sorted(REFUSALS))
@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_a_narrow_credential_makes_no_credential(world: World, endpoint: str, credential: str) -> None:
    method, path, body, action = ENDPOINTS[endpoint]
    before = _token_ids(world)
    r = world.call(method, path, world.tokens[credential], body)
    assert (r.status_code, r.json()) == (403, {"detail": REFUSALS[credential].format(action)})
    assert "set-cookie" not in r.headers
    assert _token_ids(world) == before


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_an_api_key_signs_in_to_no_credential_endpoint(world: World, endpoint: str) -> None:
    method, path, body, _ = ENDPOINTS[endpoint]
    assert world.call(method, path, world.tokens["apikey"], body).status_code == 401


def test_the_exploit_a_workloads_token_sets_its_owners_password_and_signs_in_fails(world: World) -> None:
    w = world
    for narrow in ("workload", "viewer"):
        r = w.call("PUT", "/api/v1/users/ana/password", w.tokens[narrow], {"password": NEW})
        assert r.status_code == 403, r.text
        r = w.call("POST", "/api/v1/login", None, {"name": "ana", "password": NEW})
        assert (r.status_code, r.json()) == (401, {"detail": "wrong name or password"})
    # Nor is the portal's cookie a way round: a narrowed token put there opens no apps-host session.
    cookie = {"Cookie": f"gpupool_session={w.tokens['project']}"}
    r = w.call("GET", "/apps/lab/web/", None, **cookie)
    assert (r.status_code, r.json()) == (403, {"detail": NARROWED.format(SESSIONS)})
    r = w.call("GET", "/apps/lab/web/", None, Cookie=f"gpupool_session={w.tokens['workload']}")
    assert r.status_code == 401  # the portal's cookie holds no workload's token


def test_a_person_sets_their_own_password_with_the_current_one(world: World) -> None:
    w, cy = world, world.tokens["cy"]
    r = w.call("PUT", "/api/v1/users/cy/password", cy, {"password": NEW})
    assert (r.status_code, r.json()) == (403, {"detail": "the current password is wrong"})
    r = w.call("PUT", "/api/v1/users/cy/password", w.tokens["cy-viewer"], {"password": NEW, "current": PASSWORD})
    assert (r.status_code, r.json()) == (403, {"detail": NARROWED.format(PASSWORDS)})  # knowing it or not
    w.ok("PUT", "/api/v1/users/cy/password", cy, {"password": NEW, "current": PASSWORD})
    session = w.ok("POST", "/api/v1/login", body={"name": "cy", "password": NEW})["token"]
    # A session is cy's whole identity: it changes the password (with the current one) and makes tokens.
    w.ok("PUT", "/api/v1/users/cy/password", session, {"password": PASSWORD, "current": NEW})
    assert w.ok("POST", "/api/v1/tokens", session, {"name": "from-a-login"})["token"].startswith("gp_")
    # A first password needs no current one, from the person's own full token.
    assert w.call("PUT", "/api/v1/users/dee/password", w.tokens["dee"], {"password": NEW}).status_code == 204
    w.ok("POST", "/api/v1/login", body={"name": "dee", "password": NEW})


def test_an_admin_sets_anothers_password_with_a_full_credential_only(world: World) -> None:
    w = world
    r = w.call("PUT", "/api/v1/users/dee/password", w.tokens["admin-viewer"], {"password": PASSWORD})
    assert r.status_code == 403
    w.ok("PUT", "/api/v1/users/dee/password", body={"password": PASSWORD})
    assert w.ok("POST", "/api/v1/login", body={"name": "dee", "password": PASSWORD})["name"] == "dee"
    r = w.call("PUT", "/api/v1/users/ana/password", w.tokens["cy"], {"password": PASSWORD})
    assert (r.status_code, r.json()) == (403, {"detail": "only an admin may do this"})


def test_revoking_a_session_ends_the_app_sessions_it_opened(world: World) -> None:
    w = world
    session = w.ok("POST", "/api/v1/login", body={"name": "cy", "password": PASSWORD})["token"]
    r = w.call("GET", "/apps/lab/web/", None, Cookie=f"gpupool_session={session}")
    assert r.status_code == 303, r.text
    apps_host = {"Host": f"apps.localhost:{w.s.port}"}
    r = httpx.get(w.s.url + r.headers["location"].split(f":{w.s.port}", 1)[1], headers=apps_host)
    assert r.status_code == 303, r.text
    app = {**apps_host, "Cookie": f"gpupool_app={r.cookies['gpupool_app']}"}
    assert httpx.get(w.s.url + "/apps/lab/web/", headers=app).status_code == 200
    this = max((t for t in w.ok("GET", "/api/v1/tokens", session) if t["kind"] == "session"), key=lambda t: t["id"])
    w.ok("DELETE", f"/api/v1/tokens/{this['id']}", w.tokens["cy"])
    assert w.call("GET", "/api/v1/whoami", session).status_code == 401
    assert httpx.get(w.s.url + "/apps/lab/web/", headers=app).status_code == 401
