"""Offboarding, as an admin does it: someone taken out of a project loses their running and queued work there (unless
it is kept); a disabled user's tokens, sessions and workloads' tokens are refused until enabled again; a deleted one
is out of every project and of the user list, its name kept by its history. Over the real app and store, with real
processes (the local backend), on SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from gpupool.models.schemas import WorkloadCreate
from gpupool.services import auth, workloads
from gpupool.services.auth import Principal, PrincipalCache, authenticate
from gpupool.services.errors import Forbidden, NotFound
from gpupool.store import workload_tokens
from gpupool.store.tables import WorkloadRow
from tests.api.inprocess import Api, on_socket
from tests.api.routers.factories import Factory, Person, client
from tests.api.routers.test_apps import SIGN_IN, service
from tests.e2e.conftest import GPUPOOL

pytestmark = pytest.mark.anyio

SLEEP = ["sleep", "300"]


def _off(user: str, state: str, stopped: list[str]) -> dict[str, Any]:
    """What an offboarding answers: the user, its state, the work it cancelled, and no service token left."""
    return {"user": user, "state": state, "stopped": stopped, "service_tokens": []}


async def _events(make: Factory, workload: dict[str, Any]) -> list[str]:
    detail = await make.ok("GET", f"/api/v1/workloads/{workload['id']}")
    return [e["reason"] for e in detail["events"]]


async def _whoami(make: Factory, who: Person) -> int:
    return (await make.http.get("/api/v1/whoami", headers=who.auth)).status_code


async def test_removing_a_member_cancels_their_work_in_that_project_only_and_says_why(
    fresh_api: Callable[..., Api],
) -> None:
    api = fresh_api(gpus="fake:2xH100-80GB")
    async with client(api) as http:
        make = Factory(api, http)
        dept = await make.department(2)
        vision, nlp = await make.project(dept), await make.project(dept)
        ana, bob = await make.user(vision, nlp), await make.user(vision)
        train = await make.workload(vision, ana, name="train", gpus=1, command=SLEEP)
        queued = await make.workload(vision, ana, name="later", gpus=2, command=SLEEP)  # waits: 1 GPU is free
        elsewhere = await make.workload(nlp, ana, name="eval", gpus=1, command=SLEEP)
        kept = await make.workload(vision, bob, name="bobs", gpu=0.5, command=SLEEP)
        for w in (train, elsewhere):
            await make.until_state(w, "running")

        r = await http.delete(f"/api/v1/queues/{vision}/members/{ana.name}", headers=make.admin.auth)
        assert (r.status_code, r.json()) == (
            200, _off(ana.name, "active", [f"{vision}/later", f"{vision}/train"]),
        )  # fmt: skip
        assert (await make.until_state(train, "cancelled"))["state"] == "cancelled"
        assert (await make.ok("GET", f"/api/v1/workloads/{queued['id']}"))["state"] == "cancelled"
        said = f"cancelled by admin: its owner {ana.name} was removed from project {vision}"
        assert (await _events(make, queued))[-1] == said
        assert f"{said}; stopping" in await _events(make, train)
        # Their work in another project, and another member's, go on.
        api.ctx.controller.cycle()
        assert (await make.ok("GET", f"/api/v1/workloads/{elsewhere['id']}"))["state"] == "running"
        assert (await make.until_state(kept, "running"))["state"] == "running"

        # --keep-work: taken out of nlp, their job there runs on.
        r = await http.delete(f"/api/v1/queues/{nlp}/members/{ana.name}", params={"keep_work": "true"},
                              headers=make.admin.auth)  # fmt: skip
        assert (r.status_code, r.json()) == (200, _off(ana.name, "active", []))
        api.ctx.controller.cycle()
        assert (await make.ok("GET", f"/api/v1/workloads/{elsewhere['id']}"))["state"] == "running"


async def test_a_disabled_user_signs_in_with_nothing_until_enabled_and_a_deleted_one_is_gone_for_good(
    fresh_api: Callable[..., Api],
) -> None:
    api = fresh_api(gpus="fake:2xH100-80GB")
    async with client(api) as http:
        make = Factory(api, http)
        project = await make.project(deserved_gpus=2)
        ana = await make.user(project)
        r = await http.put(f"/api/v1/users/{ana.name}/password", json={"password": "correct horse"},
                           headers=make.admin.auth)  # fmt: skip
        assert r.status_code < 300, r.text
        running = await make.workload(project, ana, name="nb", gpus=1, command=SLEEP)
        row = await make.until_state(running, "running")
        with api.ctx.sessions() as s:
            its_token = Person(ana.name, workload_tokens.mint(workload_tokens.key(s), row["id"], row["attempt"]))
        assert (await _whoami(make, ana), await _whoami(make, its_token)) == (200, 200)

        # Only an admin disables, never itself; an unknown name is not found.
        r = await http.post(f"/api/v1/users/{make.admin.name}/disable", json={}, headers=ana.auth)
        assert (r.status_code, r.json()) == (403, {"detail": "only an admin may do this"})
        r = await http.post("/api/v1/users/admin/disable", json={}, headers=make.admin.auth)
        assert (r.status_code, r.json()) == (422, {"detail": "you cannot disable yourself: another admin can"})
        r = await http.post("/api/v1/users/nobody-here/disable", json={}, headers=make.admin.auth)
        assert (r.status_code, r.json()) == (404, {"detail": "no user named 'nobody-here'"})

        # Disabled, keeping the work: its token and its workload's token are refused at once; it runs on.
        r = await http.post(f"/api/v1/users/{ana.name}/disable", json={"keep_work": True}, headers=make.admin.auth)
        assert (r.status_code, r.json()) == (200, _off(ana.name, "disabled", []))
        assert (await _whoami(make, ana), await _whoami(make, its_token)) == (401, 401)
        login = await http.post("/api/v1/login", json={"name": ana.name, "password": "correct horse"})
        assert (login.status_code, login.json()) == (
            403, {"detail": f"the user {ana.name!r} is disabled: an admin can enable it again"}
        )  # fmt: skip
        listed = [u for u in await make.ok("GET", "/api/v1/users") if u["name"] == ana.name]
        assert listed == [{"name": ana.name, "role": "member", "projects": [project], "state": "disabled"}]
        api.ctx.controller.cycle()
        assert (await make.ok("GET", f"/api/v1/workloads/{running['id']}"))["state"] == "running"

        # Enabled: the same token works again.
        r = await http.post(f"/api/v1/users/{ana.name}/enable", headers=make.admin.auth)
        assert (r.status_code, r.json()) == (200, _off(ana.name, "active", []))
        assert await _whoami(make, ana) == 200

        # Deleted: its work cancelled, its token revoked for good, out of its project and of the list.
        r = await http.delete(f"/api/v1/users/{ana.name}", headers=make.admin.auth)
        assert (r.status_code, r.json()) == (200, _off(ana.name, "deleted", [f"{project}/nb"]))
        assert (await make.until_state(running, "cancelled"))["state"] == "cancelled"
        assert (await _events(make, running))[-1] == f"cancelled by admin: its owner {ana.name} was deleted"
        assert await _whoami(make, ana) == 401
        assert ana.name not in [u["name"] for u in await make.ok("GET", "/api/v1/users")]
        gone = [u for u in await make.ok("GET", "/api/v1/users", deleted="true") if u["name"] == ana.name]
        assert gone == [{"name": ana.name, "role": "member", "projects": [], "state": "deleted"}]
        members = await make.ok("GET", f"/api/v1/queues/{project}/members")
        assert ana.name not in [m["user"] for m in members]
        r = await http.post(f"/api/v1/users/{ana.name}/enable", headers=make.admin.auth)
        assert (r.status_code, r.json()) == (404, {"detail": f"no user named {ana.name!r}"})
        r = await http.post("/api/v1/users", json={"name": ana.name}, headers=make.admin.auth)
        assert (r.status_code, r.json()) == (409, {
            "detail": f"{ana.name!r} was a user, deleted: its workloads and reports keep the name; choose another"
        })  # fmt: skip
        # Its workload keeps its owner's name.
        assert (await make.ok("GET", f"/api/v1/workloads/{running['id']}"))["owner"] == ana.name


def _cli(url: str, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"GPUPOOL_URL": url, "GPUPOOL_TOKEN": token, "PATH": "/usr/bin:/bin", "HOME": str(Path.home()),
           "COLUMNS": "200"}  # fmt: skip
    return subprocess.run([GPUPOOL, *args], env=env, capture_output=True, text=True, timeout=60)


async def test_the_command_line_offboards_and_says_what_it_stopped(fresh_api: Callable[..., Api]) -> None:
    api = fresh_api(gpus="fake:2xH100-80GB")
    async with client(api) as http:
        make = Factory(api, http)
        project = await make.project(deserved_gpus=2)
        ana, bob = await make.user(project), await make.user(project)
        await make.workload(project, ana, name="train", gpus=1, command=SLEEP)
        await make.workload(project, bob, name="sweep", gpus=1, command=SLEEP)
    with on_socket(api.app) as url:
        admin = api.admin_token
        done = _cli(url, admin, "member", "remove", project, ana.name)
        assert (done.returncode, done.stdout) == (
            0, f"{ana.name} removed from {project}; cancelled 1 of their workload(s): {project}/train\n"
        )  # fmt: skip
        done = _cli(url, admin, "user", "disable", bob.name, "--keep-work")
        assert (done.returncode, done.stdout) == (0, f"user {bob.name} disabled; none of their workloads was stopped\n")
        done = _cli(url, bob.token, "list")
        refused = f"error: the user {bob.name!r} is disabled: an admin can enable it again\n"
        assert (done.returncode, done.stderr) == (1, refused)
        rows = [line.split("│")[1:-1] for line in _cli(url, admin, "user", "list").stdout.splitlines()
                if line.startswith("│")]  # fmt: skip
        assert [[c.strip() for c in r] for r in rows if bob.name in r[0]] == [[bob.name, "member", "disabled", project]]
        done = _cli(url, admin, "user", "delete", bob.name)
        assert (done.returncode, done.stdout) == (
            0, f"user {bob.name} deleted; cancelled 1 of their workload(s): {project}/sweep\n"
        )  # fmt: skip
        done = _cli(url, admin, "user", "enable", bob.name)
        assert (done.returncode, done.stderr) == (1, f"error: no user named {bob.name!r}\n")


async def test_nothing_an_offboarded_user_made_opens_anything_but_the_projects_service_tokens_which_are_named(
    http: httpx.AsyncClient, make: Factory, api: Api
) -> None:
    """An attack round's findings: a removed or disabled member's API key still opened the service, a disabled
    admin's scrape token still read /metrics; a service token they made is the project's and is named instead."""
    project = await make.project()
    app = await service(make, project)
    ana, dave = await make.user(project), await make.user(role="admin")
    key = await make.ok("POST", "/api/v1/tokens", {"name": make.name("key"), "kind": "apikey", "project": project,
                                                   "app": app["name"]}, who=ana)  # fmt: skip
    scrape = await make.ok("POST", "/api/v1/tokens", {"name": make.name("prom"), "kind": "metrics"}, who=dave)
    ci = await make.ok("POST", "/api/v1/tokens", {"name": "ci", "kind": "service", "project": project}, who=ana)
    opens = {"Authorization": f"Bearer {key['token']}"}
    reads = {"Authorization": f"Bearer {scrape['token']}"}
    assert (await http.get(f"/apps/{project}/{app['name']}/", headers=opens)).status_code == 503  # let in
    assert (await http.get("/metrics", headers=reads)).status_code == 200

    r = await http.delete(f"/api/v1/queues/{project}/members/{ana.name}", headers=make.admin.auth)
    assert r.status_code == 200
    assert [(t["id"], t["name"], t["project"]) for t in r.json()["service_tokens"]] == [(ci["id"], "ci", project)]
    r = await http.get(f"/apps/{project}/{app['name']}/", headers=opens)
    assert (r.status_code, r.json()) == (401, SIGN_IN)
    r = await http.post(f"/api/v1/users/{dave.name}/disable", json={}, headers=make.admin.auth)
    assert r.status_code == 200
    assert (await http.get("/metrics", headers=reads)).status_code == 401
    ci_auth = {"Authorization": f"Bearer {ci['token']}"}
    assert (await http.get("/api/v1/whoami", headers=ci_auth)).json()["projects"] == [project]  # the project's


async def test_a_submit_with_a_principal_read_before_the_offboarding_is_refused_by_what_the_store_says(
    make: Factory, api: Api
) -> None:
    """The race an attack round won: a submit whose principal was read (or cached) before the user was disabled
    or removed committed after the offboarding had cancelled the user's work. The submit now asks the store
    inside its own write."""
    project = await make.project()
    ana, bob = await make.user(project), await make.user(project)
    with api.ctx.sessions() as s:
        stale_ana = authenticate(s, ana.token)
        stale_bob = authenticate(s, bob.token)
    assert stale_ana is not None and stale_bob is not None
    await make.ok("POST", f"/api/v1/users/{ana.name}/disable", {})
    await make.ok("DELETE", f"/api/v1/queues/{project}/members/{bob.name}")
    body = WorkloadCreate(project=project, command=["true"])
    settings = {"default_grace_s": 1.0, "min_runtime_s": {}, "notebooks": False}
    with api.ctx.sessions() as s:
        with pytest.raises(Forbidden, match=f"^{ana.name!r} is disabled: it can submit nothing$"):
            workloads.submit(s, stale_ana, body, **settings)
        with pytest.raises(NotFound, match=f"^no project named {project!r}$"):
            workloads.submit(s, stale_bob, body, **settings)
        assert s.scalar(select(WorkloadRow.id).where(WorkloadRow.owner_id.in_([stale_ana.id, stale_bob.id]))) is None


async def test_the_edges_of_offboarding_say_no_without_telling_who_exists(
    http: httpx.AsyncClient, make: Factory
) -> None:
    project = await make.project()
    viewer, gone = await make.user(project, role="viewer"), await make.user(project)
    await make.ok("POST", "/api/v1/tokens", {"name": "bot", "kind": "service", "project": project})
    # A viewer is refused before any name is looked up: a name that exists and one that does not answer alike.
    for name in (gone.name, "nobody-at-all"):
        r = await http.delete(f"/api/v1/queues/{project}/members/{name}", headers=viewer.auth)
        refused = f"your role (viewer) cannot take anyone out of {project!r}"
        assert (r.status_code, r.json()) == (403, {"detail": refused})
    await make.ok("PUT", f"/api/v1/users/{gone.name}/password", {"password": "a long password"})
    await make.ok("DELETE", f"/api/v1/users/{gone.name}")
    # A deleted user is no one: not put back in a project, not signed in (as a name that never was).
    r = await http.put(f"/api/v1/queues/{project}/members/{gone.name}", json={"role": "member"},
                       headers=make.admin.auth)  # fmt: skip
    assert (r.status_code, r.json()) == (404, {"detail": f"no user named {gone.name!r}"})
    r = await http.post("/api/v1/login", json={"name": gone.name, "password": "a long password"})
    assert (r.status_code, r.json()) == (401, {"detail": "wrong name or password"})
    # A project's service account is offboarded by revoking its tokens, not as a person.
    r = await http.post(f"/api/v1/users/svc-{project}-bot/disable", json={}, headers=make.admin.auth)
    assert (r.status_code, r.json()) == (422, {
        "detail": f"'svc-{project}-bot' is a project's service account: revoke its tokens (gpupool token revoke)"
    })  # fmt: skip


async def test_an_idempotency_key_replays_only_to_whoever_may_read_what_it_made(
    http: httpx.AsyncClient, make: Factory
) -> None:
    """A replay answers with the workload the key made, named by its own project; a token of the same person
    narrowed to another project (or a workload's) hears only that the key is taken: an attack round read another
    project's workload this way."""
    mine, theirs = await make.project(), await make.project()
    dual = await make.user(mine, theirs)
    headers = {**dual.auth, "Idempotency-Key": "nightly"}
    first = await http.post("/api/v1/workloads", json={"project": theirs, "command": ["true"]}, headers=headers)
    assert first.status_code == 201
    again = await http.post("/api/v1/workloads", json={"project": mine, "command": ["true"]}, headers=headers)
    assert (again.status_code, again.json()["id"], again.json()["project"]) == (200, first.json()["id"], theirs)
    narrowed = await make.ok("POST", "/api/v1/tokens", {"name": make.name("t"), "project": mine}, who=dual)
    other = await http.post("/api/v1/workloads", json={"project": mine, "command": ["true"]},
                            headers={"Authorization": f"Bearer {narrowed['token']}", "Idempotency-Key": "nightly"})
    assert (other.status_code, other.json()) == (409, {
        "detail": "Idempotency-Key 'nightly' was sent with another of your submissions: a key names one"
    })  # fmt: skip


def test_a_principal_read_while_the_cache_was_cleared_is_not_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = PrincipalCache()
    who = Principal(7, "ana", "member")

    def racing(session: Any, token: str) -> Principal:
        cache.clear()  # a user disabled while this request read its principal
        return who

    monkeypatch.setattr(auth, "authenticate", racing)
    assert cache.get(None, "gp_token") is who  # type: ignore[arg-type]
    assert cache.peek("gp_token") is None
    monkeypatch.setattr(auth, "authenticate", lambda session, token: who)
    assert cache.get(None, "gp_token") is who  # type: ignore[arg-type]
    assert cache.peek("gp_token") is who
