"""The authorization matrix: every operation of the OpenAPI table × {anonymous, bad token, admin, department admin
of this and of another department, member, viewer, service token} × {own tenant, other tenant}, each with the
one status the rules give, and nothing written when refused. Another tenant's objects are 404; a role that may
not act on an object it can see is 403."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import text
from starlette.testclient import TestClient

from tests.api.inprocess import KUBECONFIG, Api, make_api

ACTORS = ("anonymous", "bad", "admin", "dadmin", "other_dadmin", "member", "viewer", "service")
# own tenant: department d1, project p1; other tenant: department d2, project p2.
OWN, OTHER = "own", "other"


@dataclass
class World:
    api: Api
    http: TestClient
    tokens: dict[str, str]
    counter: int = 0

    def as_(self, actor: str) -> dict[str, str]:
        if actor == "anonymous":
            return {}
        if actor == "bad":
            return {"Authorization": "Bearer gp_not-a-token"}
        return {"Authorization": f"Bearer {self.tokens[actor]}"}

    def admin(self, method: str, path: str, body: Any = None, params: dict[str, str] | None = None) -> Any:
        r = self.http.request(method, path, json=body, params=params, headers=self.as_("admin"))
        assert r.status_code < 300, (method, path, r.status_code, r.text)
        return r.json() if r.content else None

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"{stem}-{self.counter}"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    api = make_api(tmp_path_factory.mktemp("matrix"))
    with TestClient(api.app) as http:
        w = World(api, http, {"admin": api.admin_token})
        for d in ("d1", "d2"):
            w.admin("POST", "/api/v1/departments", {"name": d, "deserved_gpus": 2})
        w.admin("POST", "/api/v1/projects", {"name": "p1", "department": "d1", "deserved_gpus": 1})
        w.admin("POST", "/api/v1/projects", {"name": "p2", "department": "d2", "deserved_gpus": 1})
        for name, role, project in (("member", "member", "p1"), ("viewer", "viewer", "p1"), ("bo", "member", "p2"),
                                    ("dadmin", "member", None), ("other_dadmin", "member", None)):  # fmt: skip
            body = {"name": name.replace("_", "-"), "role": role, "projects": [project] if project else []}
            w.tokens[name] = w.admin("POST", "/api/v1/users", body)["token"]
        w.admin("PUT", "/api/v1/queues/d1/members/dadmin", {"role": "admin"})
        w.admin("PUT", "/api/v1/queues/d2/members/other-dadmin", {"role": "admin"})
        r = http.post("/api/v1/tokens", json={"name": "ci", "kind": "service", "project": "p1"},
                      headers=w.as_("member"))  # fmt: skip
        assert r.status_code == 201, r.text
        w.tokens["service"] = r.json()["token"]
        for project, name in (("p1", "w1"), ("p2", "w2")):
            w.admin("POST", "/api/v1/workloads", {"project": project, "name": name, "command": ["true"]})
        yield w


def _project(tenant: str) -> str:
    return "p1" if tenant == OWN else "p2"


def _department(tenant: str) -> str:
    return "d1" if tenant == OWN else "d2"


def _workload(tenant: str) -> str:
    return "w1" if tenant == OWN else "w2"


# Who may act on the own tenant's objects, and who on the other's. Everyone else: 404 if the object is another
# tenant's, 403 if they can see it.
SEES_OWN = {"admin", "dadmin", "member", "viewer", "service"}
SEES_OTHER = {"admin", "other_dadmin"}


def _by(own: set[str], other: set[str], ok: int, denied_visible: int = 403) -> Callable[[str, str], int]:
    def expect(actor: str, tenant: str) -> int:
        allowed, sees = (own, SEES_OWN) if tenant == OWN else (other, SEES_OTHER)
        if actor in allowed:
            return ok
        return denied_visible if actor in sees else 404

    return expect


def _everyone(ok: int) -> Callable[[str, str], int]:
    return lambda actor, tenant: ok


def _only(actors: set[str], ok: int) -> Callable[[str, str], int]:
    return lambda actor, tenant: ok if actor in actors else 403


Request = tuple[str, str, Any, dict[str, str]]
EMPTY = "sha256:" + hashlib.sha256(b"").hexdigest()
Case = tuple[Callable[[World, str], Request], Callable[[str, str], int]]
MANAGERS_OWN, MANAGERS_OTHER = {"admin", "dadmin"}, {"admin", "other_dadmin"}
WRITERS_OWN = {"admin", "dadmin", "member", "service"}


def _cancel(w: World, t: str) -> Request:
    name = w.fresh("c")
    w.admin("POST", "/api/v1/workloads", {"project": _project(t), "name": name, "command": ["true"]})
    return "POST", f"/api/v1/workloads/{name}/cancel", None, {"project": _project(t)}


def _finished(w: World, t: str, name: str | None = None) -> str:
    """A fresh workload of the tenant's project (or the one named) that has ended (cycles run by hand: no loop
    runs here)."""
    if name is None:
        name = w.fresh("f")
        w.admin("POST", "/api/v1/workloads", {"project": _project(t), "name": name, "command": ["true"]})
    deadline = time.monotonic() + 30
    while w.admin("GET", f"/api/v1/workloads/{name}", params={"project": _project(t)})["state"] != "succeeded":
        assert time.monotonic() < deadline, f"{name} did not end"
        w.api.ctx.controller.cycle()
        time.sleep(0.02)
    return name


def _rerun(w: World, t: str) -> Request:
    return "POST", f"/api/v1/workloads/{_finished(w, t)}/rerun", None, {"project": _project(t)}


def _delete(w: World, t: str) -> Request:
    return "DELETE", f"/api/v1/workloads/{_finished(w, t)}", None, {"project": _project(t)}


def _revoke(w: World, t: str) -> Request:
    owner = "member" if t == OWN else "bo"
    r = w.http.post("/api/v1/tokens", json={"name": w.fresh("t")}, headers=w.as_(owner))
    assert r.status_code == 201, r.text
    return "DELETE", f"/api/v1/tokens/{r.json()['id']}", None, {}


def _remove_member(w: World, t: str) -> Request:
    name = w.fresh("u")
    w.admin("POST", "/api/v1/users", {"name": name, "projects": [_project(t)]})
    return "DELETE", f"/api/v1/queues/{_project(t)}/members/{name}", None, {}


def _offboard(what: str) -> Callable[[World, str], Request]:
    """Disable, enable or delete a fresh user of the tenant's project (only admins offboard anyone)."""

    def build(w: World, t: str) -> Request:
        name = w.fresh("u")
        w.admin("POST", "/api/v1/users", {"name": name, "projects": [_project(t)]})
        if what == "delete":
            return "DELETE", f"/api/v1/users/{name}", None, {}
        return "POST", f"/api/v1/users/{name}/{what}", {} if what == "disable" else None, {}

    return build


def _set_member(w: World, t: str) -> Request:
    name = w.fresh("u")
    w.admin("POST", "/api/v1/users", {"name": name})
    return "PUT", f"/api/v1/queues/{_project(t)}/members/{name}", {"role": "viewer"}, {}


def _secret_name(w: World) -> str:
    return w.fresh("S").upper().replace("-", "_")


def _delete_secret(w: World, t: str) -> Request:
    name = _secret_name(w)
    w.admin("PUT", f"/api/v1/projects/{_project(t)}/secrets/{name}", {"value": "x"})
    return "DELETE", f"/api/v1/projects/{_project(t)}/secrets/{name}", None, {}


def _delete_volume(w: World, t: str) -> Request:
    name = w.fresh("v")
    w.admin("POST", "/api/v1/volumes", {"project": _project(t), "name": name, "size": "64MiB"})
    return "DELETE", f"/api/v1/volumes/{name}", None, {"project": _project(t)}


def _sweep_body(w: World, t: str) -> dict[str, Any]:
    space = {"x": {"type": "float", "low": 0, "high": 1}}
    return {"name": w.fresh("s"), "project": _project(t), "command": ["true"], "space": space, "trials": 1}


def _sweep(w: World, t: str) -> str:
    """A fresh sweep of the tenant's project (no loop runs here: it never submits a trial)."""
    body = _sweep_body(w, t)
    w.admin("POST", "/api/v1/sweeps", body)
    return f"/api/v1/sweeps/{_project(t)}/{body['name']}"


def _spoke(w: World) -> str:
    """A fresh spoke that is never reached (nothing listens on its port)."""
    name = w.fresh("k")
    w.admin("POST", "/api/v1/clusters", {"name": name, "kubeconfig": KUBECONFIG})
    return name


CASES: dict[str, Case] = {
    "healthz": (lambda w, t: ("GET", "/healthz", None, {}), _everyone(200)),
    # The app under test has no scheduler loop running, so it is live but never ready: the same answer for all.
    "readyz": (lambda w, t: ("GET", "/readyz", None, {}), _everyone(503)),
    "metrics": (lambda w, t: ("GET", "/metrics", None, {}), _everyone(200)),
    "whoami": (lambda w, t: ("GET", "/api/v1/whoami", None, {}), _everyone(200)),
    "list_departments": (lambda w, t: ("GET", "/api/v1/departments", None, {}), _everyone(200)),
    "list_projects": (lambda w, t: ("GET", "/api/v1/projects", None, {}), _everyone(200)),
    "create_department": (
        lambda w, t: ("POST", "/api/v1/departments", {"name": w.fresh("d")}, {}),
        _only({"admin"}, 201),
    ),
    "create_project": (
        lambda w, t: ("POST", "/api/v1/projects", {"name": w.fresh("p"), "department": _department(t)}, {}),
        _by(MANAGERS_OWN, MANAGERS_OTHER, 201),
    ),
    "update_quota": (
        lambda w, t: ("PATCH", f"/api/v1/queues/{_project(t)}/quota", {"deserved_gpus": 1}, {}),
        _by(MANAGERS_OWN, MANAGERS_OTHER, 200),
    ),
    "get_policy": (
        lambda w, t: ("GET", f"/api/v1/queues/{_project(t)}/policy", None, {}),
        _by(SEES_OWN, SEES_OTHER, 200),
    ),
    "update_policy": (
        lambda w, t: ("PATCH", f"/api/v1/queues/{_project(t)}/policy", {"idle_timeout_s": {"notebook": 600}}, {}),
        _by(MANAGERS_OWN, MANAGERS_OTHER, 200),
    ),
    "list_users": (lambda w, t: ("GET", "/api/v1/users", None, {}), _only({"admin", "dadmin", "other_dadmin"}, 200)),
    "create_user": (
        lambda w, t: ("POST", "/api/v1/users", {"name": w.fresh("u"), "projects": [_project(t)]}, {}),
        _by(MANAGERS_OWN, MANAGERS_OTHER, 201),
    ),
    "create_token": (
        lambda w, t: ("POST", "/api/v1/tokens", {"name": w.fresh("t"), "project": _project(t)}, {}),
        lambda actor, t: 403 if actor == "service" else _by(SEES_OWN, SEES_OTHER, 201)(actor, t),
    ),
    "list_tokens": (lambda w, t: ("GET", "/api/v1/tokens", None, {}), _everyone(200)),
    "revoke_token": (_revoke, lambda actor, t: 200 if actor == "admin" or (actor == "member" and t == OWN) else 404),
    "list_members": (
        lambda w, t: ("GET", f"/api/v1/queues/{_project(t)}/members", None, {}),
        _by(MANAGERS_OWN, MANAGERS_OTHER, 200),
    ),
    "set_member": (_set_member, _by(MANAGERS_OWN, MANAGERS_OTHER, 200)),
    "remove_member": (_remove_member, _by(MANAGERS_OWN, MANAGERS_OTHER, 200)),
    "disable_user": (_offboard("disable"), _only({"admin"}, 200)),
    "enable_user": (_offboard("enable"), _only({"admin"}, 200)),
    "delete_user": (_offboard("delete"), _only({"admin"}, 200)),
    "update_project": (
        lambda w, t: ("PATCH", f"/api/v1/projects/{_project(t)}", {"production_allowed": False}, {}),
        _by(MANAGERS_OWN, MANAGERS_OTHER, 200),
    ),
    "list_secrets": (
        lambda w, t: ("GET", f"/api/v1/projects/{_project(t)}/secrets", None, {}),
        _by(WRITERS_OWN, MANAGERS_OTHER, 200),
    ),
    "set_secret": (
        lambda w, t: ("PUT", f"/api/v1/projects/{_project(t)}/secrets/{_secret_name(w)}", {"value": "s3cret"}, {}),
        _by(WRITERS_OWN, MANAGERS_OTHER, 200),
    ),
    "delete_secret": (_delete_secret, _by(WRITERS_OWN, MANAGERS_OTHER, 204)),
    "list_audit": (lambda w, t: ("GET", "/api/v1/audit", None, {}), _only({"admin", "dadmin", "other_dadmin"}, 200)),
    "submit_workload": (
        lambda w, t: (
            "POST",
            "/api/v1/workloads",
            {"project": _project(t), "name": w.fresh("s"), "command": ["true"]},
            {},
        ),
        _by(WRITERS_OWN, MANAGERS_OTHER, 201),
    ),
    "list_workloads": (lambda w, t: ("GET", "/api/v1/workloads", None, {}), _everyone(200)),
    "describe_workload": (
        lambda w, t: ("GET", f"/api/v1/workloads/{_workload(t)}", None, {"project": _project(t)}),
        _by(SEES_OWN, SEES_OTHER, 200),
    ),
    "cancel_workload": (_cancel, _by(WRITERS_OWN, MANAGERS_OTHER, 200)),
    "resume_workload": (  # it is not suspended: those who may resume it hear why they cannot
        lambda w, t: ("POST", f"/api/v1/workloads/{_workload(t)}/resume", None, {"project": _project(t)}),
        _by(WRITERS_OWN, MANAGERS_OTHER, 409),
    ),
    "rerun_workload": (_rerun, _by(WRITERS_OWN, MANAGERS_OTHER, 201)),
    "delete_workload": (_delete, _by(WRITERS_OWN, MANAGERS_OTHER, 200)),
    "apply_workload": (
        lambda w, t: (
            "PUT",
            f"/api/v1/workloads/{w.fresh('a')}",
            {"project": _project(t), "command": ["true"]},
            {"project": _project(t)},
        ),
        _by(WRITERS_OWN, MANAGERS_OTHER, 201),
    ),
    "usage_report": (lambda w, t: ("GET", "/api/v1/reports/usage", None, {"start": "0", "end": "1"}), _everyone(200)),
    "rightsizing_report": (  # a project's report is read by those who read the project
        lambda w, t: ("GET", "/api/v1/reports/rightsizing", None, {"project": _project(t)}),
        _by(SEES_OWN, SEES_OTHER, 200),
    ),
    "workload_logs": (
        lambda w, t: ("GET", f"/api/v1/workloads/{_workload(t)}/logs", None, {"project": _project(t)}),
        _by(SEES_OWN, SEES_OTHER, 200),
    ),
    "code_limits": (lambda w, t: ("GET", "/api/v1/code/limits", None, {}), _everyone(200)),
    "code_missing": (
        lambda w, t: ("POST", "/api/v1/code/missing", {"project": _project(t), "digests": [EMPTY]}, {}),
        _by(WRITERS_OWN, MANAGERS_OTHER, 200),
    ),
    "upload_code_blob": (  # an empty body is the empty blob's
        lambda w, t: ("PUT", f"/api/v1/code/blobs/{EMPTY}", None, {"project": _project(t)}),
        _by(WRITERS_OWN, MANAGERS_OTHER, 204),
    ),
    "upload_code_manifest": (
        lambda w, t: ("PUT", "/api/v1/code/manifests", {"files": []}, {"project": _project(t)}),
        _by(WRITERS_OWN, MANAGERS_OTHER, 200),
    ),
    "collect_code": (lambda w, t: ("POST", "/api/v1/code/collect", None, {}), _only({"admin"}, 200)),
    # w1 and w2 have no code: those who may read them hear so; a code token is tested in tests/e2e/test_code.py.
    "workload_code": (
        lambda w, t: ("GET", f"/api/v1/workloads/{_workload(t)}/code", None, {"project": _project(t)}),
        _by(set(), set(), 404, denied_visible=404),
    ),
    "workload_code_blob": (
        lambda w, t: ("GET", f"/api/v1/workloads/{_workload(t)}/code/blobs/{EMPTY}", None, {"project": _project(t)}),
        _by(set(), set(), 404, denied_visible=404),
    ),
    # w1 and w2, once ended, have a working directory: readers get it (a tar); writers sending no tar hear so.
    "get_files": (
        lambda w, t: (
            "GET",
            f"/api/v1/workloads/{_finished(w, t, _workload(t))}/files",
            None,
            {"project": _project(t)},
        ),
        _by(SEES_OWN, SEES_OTHER, 200),
    ),
    "put_files": (
        lambda w, t: (
            "PUT",
            f"/api/v1/workloads/{_finished(w, t, _workload(t))}/files",
            None,
            {"project": _project(t)},
        ),
        _by(WRITERS_OWN, MANAGERS_OTHER, 422),
    ),
    "get_workload_metrics": (
        lambda w, t: ("GET", f"/api/v1/workloads/{_workload(t)}/metrics", None, {"project": _project(t)}),
        _by(SEES_OWN, SEES_OTHER, 200),
    ),
    "create_volume": (
        lambda w, t: ("POST", "/api/v1/volumes", {"project": _project(t), "name": w.fresh("v"), "size": "64MiB"}, {}),
        _by(WRITERS_OWN, MANAGERS_OTHER, 201),
    ),
    "list_volumes": (
        lambda w, t: ("GET", "/api/v1/volumes", None, {"project": _project(t)}),
        _by(SEES_OWN, SEES_OTHER, 200),
    ),
    "delete_volume": (_delete_volume, _by(WRITERS_OWN, MANAGERS_OTHER, 204)),
    # The portal's sign-in with a token: the caller's own into its cookies; not a narrow one (tests/security/).
    "cookie_session": (lambda w, t: ("POST", "/api/v1/session", None, {}), _only(set(ACTORS) - {"service"}, 200)),
    "get_nodes": (lambda w, t: ("GET", "/api/v1/nodes", None, {}), _everyone(200)),
    "list_pools": (lambda w, t: ("GET", "/api/v1/pools", None, {}), _everyone(200)),
    "update_pool": (
        lambda w, t: ("PATCH", "/api/v1/pools/default", {"share_across_projects": False}, {}),
        _only({"admin"}, 200),
    ),
    "set_password": (
        lambda w, t: (
            "PUT",
            f"/api/v1/users/{'member' if t == OWN else 'bo'}/password",
            {"password": "a long password"},
            {},
        ),
        lambda actor, t: 204 if actor == "admin" else 403,
    ),
    # Clusters say where work may go: anyone reads the list; only admins see one's workloads, or change the fleet.
    "list_clusters": (lambda w, t: ("GET", "/api/v1/clusters", None, {}), _everyone(200)),
    # Sweeps are their project's: its writers start and cancel them, its readers see them.
    "create_sweep": (
        lambda w, t: ("POST", "/api/v1/sweeps", _sweep_body(w, t), {}),
        _by(WRITERS_OWN, MANAGERS_OTHER, 201),
    ),
    "list_sweeps": (lambda w, t: ("GET", "/api/v1/sweeps", None, {}), _everyone(200)),
    "describe_sweep": (lambda w, t: ("GET", _sweep(w, t), None, {}), _by(SEES_OWN, SEES_OTHER, 200)),
    "sweep_plot": (lambda w, t: ("GET", f"{_sweep(w, t)}/plot.png", None, {}), _by(SEES_OWN, SEES_OTHER, 200)),
    "cancel_sweep": (
        lambda w, t: ("POST", f"{_sweep(w, t)}/cancel", None, {}),
        _by(WRITERS_OWN, MANAGERS_OTHER, 200),
    ),
    # Whether a department's work may burst: read by whoever sees the department, set by admins alone.
    "get_department_burst": (
        lambda w, t: ("GET", f"/api/v1/departments/{_department(t)}/burst", None, {}),
        _by(SEES_OWN, SEES_OTHER, 200),
    ),
    "set_department_burst": (
        lambda w, t: ("PUT", f"/api/v1/departments/{_department(t)}/burst", {"monthly_budget": 100}, {}),
        _by({"admin"}, {"admin"}, 200),
    ),
    "add_cluster": (
        lambda w, t: ("POST", "/api/v1/clusters", {"name": w.fresh("k"), "kubeconfig": KUBECONFIG}, {}),
        _only({"admin"}, 201),
    ),
    "describe_cluster": (lambda w, t: ("GET", "/api/v1/clusters/home", None, {}), _only({"admin"}, 200)),
    "drain_cluster": (
        lambda w, t: ("POST", f"/api/v1/clusters/{_spoke(w)}/drain", {"draining": True}, {}),
        _only({"admin"}, 200),
    ),
    "remove_cluster": (lambda w, t: ("DELETE", f"/api/v1/clusters/{_spoke(w)}", None, {}), _only({"admin"}, 204)),
    "get_shares": (lambda w, t: ("GET", "/api/v1/shares", None, {}), _everyone(200)),
    "get_timeline": (lambda w, t: ("GET", "/api/v1/reports/timeline", None, {}), _everyone(200)),
    # Single sign-on needs no token, and this in-process server has no provider: every actor hears so (the
    # flows themselves are tested against a real Dex in tests/oidc/test_sso.py).
    "sso_config": (lambda w, t: ("GET", "/api/v1/sso/config", None, {}), _everyone(200)),
    "sso_login": (lambda w, t: ("GET", "/api/v1/sso/login", None, {}), _everyone(404)),
    "sso_callback": (lambda w, t: ("GET", "/api/v1/sso/callback", None, {"code": "c", "state": "s"}), _everyone(404)),
    "sso_session": (lambda w, t: ("POST", "/api/v1/sso/session", None, {}), _everyone(404)),
    "sso_device_begin": (lambda w, t: ("POST", "/api/v1/sso/device", None, {}), _everyone(404)),
    "sso_device_poll": (lambda w, t: ("POST", f"/api/v1/sso/device/{'h' * 43}", None, {}), _everyone(404)),
}
NO_AUTH = {
    "healthz",
    "readyz",
    "sso_config",
    "sso_login",
    "sso_callback",
    "sso_session",
    "sso_device_begin",
    "sso_device_poll",
}
# Tested on their own below: signing in needs no token, and signing out ends the caller's own session.
ELSEWHERE = {"login", "logout"}


def _fingerprint(w: World) -> str:
    """Everything a request could change, but the audit trail and when a token was last used."""
    tables = ("queues", "quotas", "users", "memberships", "workloads", "events", "allocations", "pools", "secrets",
              "code_blobs", "code_manifests", "volumes", "clusters")  # fmt: skip
    digest = hashlib.sha256()
    with w.api.ctx.sessions() as s:
        for table in tables:
            for row in s.execute(text(f"SELECT * FROM {table} ORDER BY 1")):
                digest.update(repr(tuple(row)).encode())
        for row in s.execute(text("SELECT id, kind, revoked_at, expires_at, role FROM tokens ORDER BY id")):
            digest.update(repr(tuple(row)).encode())
    return digest.hexdigest()


def test_every_operation_has_a_row_in_the_matrix(world: World) -> None:
    operations = {op["operationId"] for ops in world.api.app.openapi()["paths"].values() for op in ops.values()}
    assert operations == set(CASES) | ELSEWHERE


@pytest.mark.parametrize("operation", sorted(CASES))
def test_the_matrix(world: World, operation: str) -> None:
    build, expect = CASES[operation]
    got: dict[tuple[str, str], int] = {}
    want: dict[tuple[str, str], int] = {}
    for tenant in (OWN, OTHER):
        for actor in ACTORS:
            method, path, body, params = build(world, tenant)
            before = _fingerprint(world)
            world.http.cookies.clear()  # each actor is its header alone (the session case sets the portal's cookies)
            r = world.http.request(method, path, json=body, params=params, headers=world.as_(actor))
            got[actor, tenant] = r.status_code
            anonymous = actor in ("anonymous", "bad") and operation not in NO_AUTH
            want[actor, tenant] = 401 if anonymous else expect(actor, tenant)
            if r.status_code >= 400:
                assert _fingerprint(world) == before, (operation, actor, tenant, "wrote on refusal")
                # /readyz's 503 is its report (which part is not ready), not a refusal.
                assert set(r.json()) == ({"status", "store", "scheduler"} if operation == "readyz" else {"detail"})
                if operation.startswith("sso_"):
                    assert r.json() == {"detail": "single sign-on is not configured"}
    assert got == want


def test_sign_in_and_out(world: World) -> None:
    w = world
    w.admin("PUT", "/api/v1/users/viewer/password", {"password": "viewer's password"})
    bad = w.http.post("/api/v1/login", json={"name": "viewer", "password": "wrong password"})
    assert bad.status_code == 401
    ok = w.http.post("/api/v1/login", json={"name": "viewer", "password": "viewer's password"})
    assert ok.status_code == 200 and ok.headers["cache-control"] == "no-store"
    session = {"Authorization": f"Bearer {ok.json()['token']}"}
    assert w.http.get("/api/v1/whoami", headers=session).json()["name"] == "viewer"
    assert w.http.post("/api/v1/logout", headers=session).status_code == 204
    assert w.http.get("/api/v1/whoami", headers=session).status_code == 401
    assert w.http.post("/api/v1/logout").status_code == 401


def test_every_mutating_operation_leaves_an_audit_record(world: World) -> None:
    w = world
    mutating = [(m.upper(), path) for path, ops in w.api.app.openapi()["paths"].items() for m in ops
                if m.upper() in ("POST", "PUT", "PATCH", "DELETE")]  # fmt: skip
    # 19, single sign-on's session, device and device/{handle}, 4 of code, rerun, delete and apply, volumes' create
    # and delete, a workload's files, the portal's cookie session, clusters' add, drain and remove, a
    # department's burst settings, sweeps' create and cancel, and a user's disable, enable and delete
    assert len(mutating) == 42
    for i, (method, path) in enumerate(mutating):
        concrete = path.replace("{name}", "p1").replace("{user}", "member").replace("{token_id}", "1")
        concrete = concrete.replace("{ref}", "w1").replace("{handle}", "h" * 43).replace("{digest}", EMPTY)
        r = w.http.request(method, concrete, json={}, headers={"X-Request-ID": f"matrix-audit-{i:04d}"})
        rid = r.headers["x-request-id"]
        assert rid == f"matrix-audit-{i:04d}"  # a caller's request id is kept, to follow a request across logs
        found = [a for a in w.http.get("/api/v1/audit", params={"limit": 1000}, headers=w.as_("admin")).json()
                 if a["request_id"] == rid]  # fmt: skip
        assert [(a["action"], a["status"]) for a in found] == [(f"{method} {path}", r.status_code)], (method, path)
    # A success names who, in which role, on which tenant's object.
    r = w.http.post("/api/v1/workloads", json={"project": "p1", "name": "audited", "command": ["true"]},
                    headers=w.as_("member"))  # fmt: skip
    mine = [a for a in w.http.get("/api/v1/audit", params={"actor": "member"}, headers=w.as_("dadmin")).json()
            if a["request_id"] == r.headers["x-request-id"]]  # fmt: skip
    assert [(a["role"], a["tenant"], a["department"], a["object"], a["status"]) for a in mine] == [
        ("member", "p1", "d1", "workload/audited", 201)
    ]
    # A department admin reads its department's records only.
    theirs = w.http.get("/api/v1/audit", params={"limit": 1000}, headers=w.as_("other_dadmin")).json()
    assert {a["department"] for a in theirs} == {"d2"}
    assert json.dumps(theirs).count('"p1"') == 0
