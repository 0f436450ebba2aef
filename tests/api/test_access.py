"""Tokens, roles and sign-in, in-process on a real SQLite store: what each token and role may do, how tokens end,
what a department admin may and may not grant, production priority, passwords and the limit on guessing."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from gpupool.services import sessions
from gpupool.services.auth import authenticate
from gpupool.services.sessions import LoginLimiter, TooManyAttempts
from tests.api.inprocess import Api, make_api


class Caller:
    def __init__(self, http: TestClient, token: str) -> None:
        self.http, self.token = http, token

    def __call__(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        r = self.http.request(method, path, json=body, params=params, headers={"Authorization": f"Bearer {self.token}"})
        return r.status_code, (r.json() if r.content else None)


@pytest.fixture
def org(tmp_path: Any) -> Iterator[tuple[Api, TestClient, dict[str, Caller]]]:
    api = make_api(tmp_path)
    with TestClient(api.app) as http:
        admin = Caller(http, api.admin_token)
        for body in ({"name": "d1", "deserved_gpus": 2}, {"name": "d2", "deserved_gpus": 2}):
            assert admin("POST", "/api/v1/departments", body)[0] == 201
        for name, dept in (("p1", "d1"), ("p2", "d2")):
            assert admin("POST", "/api/v1/projects", {"name": name, "department": dept, "deserved_gpus": 1})[0] == 201
        callers = {"admin": admin}
        for name, role, projects in (("ana", "member", ["p1"]), ("vic", "viewer", ["p1"]), ("dee", "member", [])):
            status, made = admin("POST", "/api/v1/users", {"name": name, "role": role, "projects": projects})
            assert status == 201
            callers[name] = Caller(http, made["token"])
        assert admin("PUT", "/api/v1/queues/d1/members/dee", {"role": "admin"})[0] == 200
        yield api, http, callers


def test_a_token_narrowed_to_a_project_and_a_role_does_no_more(org: Any) -> None:
    api, http, c = org
    status, made = c["ana"]("POST", "/api/v1/tokens", {"name": "ro", "project": "p1", "role": "viewer"})
    assert (status, made["kind"], made["role"], made["project"]) == (201, "personal", "viewer", "p1")
    ro = Caller(http, made["token"])
    assert ro("GET", "/api/v1/whoami")[1] == {"name": "ana", "role": "viewer", "projects": ["p1"], "departments": []}
    assert ro("POST", "/api/v1/workloads", {"project": "p1", "command": ["true"]})[0] == 403
    assert c["ana"]("POST", "/api/v1/workloads", {"project": "p1", "name": "mine", "command": ["true"]})[0] == 201
    assert ro("GET", "/api/v1/workloads/mine")[0] == 200
    # More than its creator may do is refused; a viewer cannot mint a member's token.
    assert c["vic"]("POST", "/api/v1/tokens", {"name": "up", "project": "p1", "role": "member"})[0] == 403
    # Revoked: refused at once. Expired: refused when its day comes.
    assert c["ana"]("DELETE", f"/api/v1/tokens/{made['id']}")[0] == 200
    assert ro("GET", "/api/v1/whoami")[0] == 401
    status, day = c["ana"]("POST", "/api/v1/tokens", {"name": "day", "expires_in_days": 1})
    with api.ctx.sessions() as s:
        assert authenticate(s, day["token"], now=time.time() + 3600) is not None
        assert authenticate(s, day["token"], now=time.time() + 2 * 86400) is None


def test_a_service_token_belongs_to_its_project_not_to_its_maker(org: Any) -> None:
    _, http, c = org
    status, made = c["ana"]("POST", "/api/v1/tokens", {"name": "ci", "kind": "service", "project": "p1"})
    assert (status, made["user"], made["role"]) == (201, "svc-p1-ci", "member")
    ci = Caller(http, made["token"])
    assert ci("POST", "/api/v1/workloads", {"project": "p1", "command": ["true"]})[0] == 201
    assert ci("GET", "/api/v1/projects")[1][0]["name"] == "p1"
    assert ci("POST", "/api/v1/tokens", {"name": "more"})[0] == 403  # it cannot make tokens of its own
    assert c["admin"]("DELETE", "/api/v1/queues/p1/members/ana")[0] == 200
    assert ci("POST", "/api/v1/workloads", {"project": "p1", "command": ["true"]})[0] == 201
    assert c["ana"]("GET", "/api/v1/workloads")[1]["items"] == []  # and its maker, removed, sees nothing


def test_a_department_admin_runs_its_department_and_nothing_beyond(org: Any) -> None:
    _, _, c = org
    dee = c["dee"]
    assert dee("GET", "/api/v1/whoami")[1]["role"] == "department-admin"
    assert dee("POST", "/api/v1/projects", {"name": "p3", "department": "d1", "deserved_gpus": 1})[0] == 201
    status, body = dee("PATCH", "/api/v1/queues/p3/quota", {"deserved_gpus": 1.5})
    assert (status, body["detail"]) == (422, "the children of 'd1' would deserve 2.5 GPUs in pool 'default', "
                                              "more than its own 2")  # fmt: skip
    assert dee("PATCH", "/api/v1/queues/d1/quota", {"deserved_gpus": 8})[0] == 403  # its own budget is not its own
    assert dee("PUT", "/api/v1/queues/p3/members/vic", {"role": "member"})[0] == 200
    assert dee("PUT", "/api/v1/queues/d1/members/vic", {"role": "admin"})[0] == 403  # no new department admins
    assert dee("POST", "/api/v1/users", {"name": "root2", "role": "admin", "projects": ["p3"]})[0] == 403
    assert dee("PUT", "/api/v1/queues/p2/members/vic", {"role": "member"})[0] == 404  # another department
    assert dee("PATCH", "/api/v1/projects/p3", {"pod_security": "baseline"})[0] == 403  # admins only
    assert dee("PATCH", "/api/v1/queues/p3/policy", {"idle_timeout_s": {"notebook": 600}})[0] == 200
    assert [d["name"] for d in dee("GET", "/api/v1/departments")[1]] == ["d1"]


def test_members_pick_production_only_where_their_project_allows_it(org: Any) -> None:
    _, _, c = org
    job = {"project": "p1", "name": "svc", "type": "inference", "command": ["serve"], "port": 8000}
    status, body = c["ana"]("POST", "/api/v1/workloads", job)
    assert (status, body["detail"]) == (
        403, "project 'p1' does not allow production priority for members; choose another --priority, or ask an "
        "admin to allow it (gpupool project set NAME --production-allowed)",
    )  # fmt: skip
    assert c["ana"]("POST", "/api/v1/workloads", {**job, "priority": "training"})[0] == 201
    assert c["dee"]("PATCH", "/api/v1/projects/p1", {"production_allowed": True})[0] == 200
    assert c["ana"]("POST", "/api/v1/workloads", {**job, "name": "svc2"})[0] == 201


def test_changing_your_password_needs_the_current_one_and_ends_your_other_sessions(org: Any) -> None:
    _, http, c = org
    assert c["admin"]("PUT", "/api/v1/users/ana/password", {"password": "first password"})[0] == 204
    sign_in = {"name": "ana", "password": "first password"}
    here, there = (Caller(http, http.post("/api/v1/login", json=sign_in).json()["token"]) for _ in range(2))
    assert here("PUT", "/api/v1/users/ana/password", {"password": "second password", "current": "wrong"})[0] == 403
    assert here("PUT", "/api/v1/users/ana/password", {"password": "second password"})[0] == 403
    ok = {"password": "second password", "current": "first password"}
    assert here("PUT", "/api/v1/users/ana/password", ok)[0] == 204
    assert here("GET", "/api/v1/whoami")[0] == 200
    assert there("GET", "/api/v1/whoami")[0] == 401
    assert c["ana"]("GET", "/api/v1/whoami")[0] == 200  # a personal token is not a session
    assert http.post("/api/v1/login", json=sign_in).status_code == 401


def test_guessing_is_limited_per_account_and_address_without_locking_the_user_out() -> None:
    now = [0.0]
    limiter = LoginLimiter(clock=lambda: now[0])
    for _ in range(5):
        limiter.check("ana", "10.0.0.66")
        limiter.failed("ana", "10.0.0.66")
    with pytest.raises(TooManyAttempts) as locked:
        limiter.check("ana", "10.0.0.66")
    assert (locked.value.status, locked.value.retry_after_s) == (429, 30)
    limiter.check("ana", "10.0.0.7")  # the user, elsewhere, is not locked out by the attacker
    now[0] = 30.5
    limiter.check("ana", "10.0.0.66")
    limiter.failed("ana", "10.0.0.66")  # the sixth failure: 60 s, doubling up to 15 minutes
    with pytest.raises(TooManyAttempts) as again:
        limiter.check("ana", "10.0.0.66")
    assert again.value.retry_after_s == 60
    for _ in range(10):
        now[0] += 1000
        limiter.failed("ana", "10.0.0.66")
    with pytest.raises(TooManyAttempts) as capped:
        limiter.check("ana", "10.0.0.66")
    assert capped.value.retry_after_s == 900
    limiter.succeeded("ana", "10.0.0.66")
    limiter.check("ana", "10.0.0.66")


def test_one_address_guessing_many_accounts_is_stopped() -> None:
    limiter = LoginLimiter(clock=lambda: 0.0)
    for i in range(LoginLimiter.ADDRESS_FAILURES):
        limiter.failed(f"user{i}", "10.0.0.66")
    with pytest.raises(TooManyAttempts) as stopped:
        limiter.check("someone-new", "10.0.0.66")
    assert stopped.value.retry_after_s == 600
    limiter.check("someone-new", "10.0.0.7")


def test_a_sign_in_costs_one_scrypt_whether_the_name_exists_or_not(org: Any, monkeypatch: Any) -> None:
    api, _, c = org
    assert c["admin"]("PUT", "/api/v1/users/ana/password", {"password": "a password"})[0] == 204
    calls: list[int] = []
    real = hashlib.scrypt

    def counted(*args: Any, **kw: Any) -> bytes:
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(sessions.hashlib, "scrypt", counted)
    limiter = LoginLimiter()
    with api.ctx.sessions() as s:
        for name, password in (("ana", "wrong"), ("nobody", "wrong"), ("vic", "no password set")):
            calls.clear()
            with pytest.raises(sessions.Unauthorized):
                sessions.login(s, name, password, "10.0.0.1", limiter)
            assert len(calls) == 1, name


def test_a_login_refused_by_the_limit_is_429_with_retry_after(org: Any) -> None:
    api, http, _ = org
    api.ctx.limiter = LoginLimiter(clock=lambda: 0.0)
    for _ in range(5):
        assert http.post("/api/v1/login", json={"name": "ana", "password": "guess"}).status_code == 401
    r = http.post("/api/v1/login", json={"name": "ana", "password": "guess"})
    assert (r.status_code, r.headers["retry-after"], r.json()) == (
        429, "30", {"detail": "too many failed sign-ins; try again in 30 s"},
    )  # fmt: skip


def test_shares_and_metrics_show_a_caller_only_its_own_tenants(org: Any) -> None:
    from gpupool.core.decision import Decision, QueueShare

    api, http, c = org
    api.ctx.controller.last_decision = Decision(
        shares=tuple(QueueShare(q, "default", 1000, 1000, 0, None, 0) for q in ("d1", "d2", "p1", "p2"))
    )
    seen = {who: sorted(x["queue"] for x in c[who]("GET", "/api/v1/shares")[1]) for who in ("admin", "dee", "ana")}
    assert seen == {"admin": ["d1", "d2", "p1", "p2"], "dee": ["d1", "p1"], "ana": ["d1", "p1"]}

    def projects(text: str) -> list[str]:
        return sorted({ln.split('project="')[1].split('"')[0] for ln in text.splitlines() if 'project="' in ln})

    assert projects(http.get("/metrics", headers={"Authorization": f"Bearer {c['ana'].token}"}).text) == ["p1"]
    status, scrape = c["admin"]("POST", "/api/v1/tokens", {"name": "prometheus", "kind": "metrics"})
    assert (status, scrape["token"][:4]) == (201, "gpm_")
    everything = http.get("/metrics", headers={"Authorization": f"Bearer {scrape['token']}"}).text
    assert projects(everything) == ["p1", "p2"]
    assert http.get("/api/v1/whoami", headers={"Authorization": f"Bearer {scrape['token']}"}).status_code == 401
    assert c["ana"]("POST", "/api/v1/tokens", {"name": "mine", "kind": "metrics"})[0] == 403
