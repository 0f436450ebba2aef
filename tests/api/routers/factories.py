"""Departments, projects, people and workloads for the router tests, made through the API as its admin (the wire
stays stable while the services and the store behind it change). Every name is new, so tests that share one
server never see each other's objects."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

import anyio
import httpx

from tests.api.inprocess import Api

_serial = itertools.count(1)


def client(api: Api) -> httpx.AsyncClient:
    """A client of the app through httpx's ASGI transport. An error in the app is the 500 a server would answer,
    not an exception in the test."""
    transport = httpx.ASGITransport(app=api.app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://testserver")


@dataclass(frozen=True)
class Person:
    name: str
    token: str

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


class Factory:
    def __init__(self, api: Api, http: httpx.AsyncClient) -> None:
        self.api, self.http = api, http
        self.admin = Person("admin", api.admin_token)

    @staticmethod
    def name(stem: str) -> str:
        return f"{stem}-{next(_serial)}"

    async def ok(self, method: str, path: str, body: Any = None, who: Person | None = None, **params: Any) -> Any:
        """A call that must succeed (set-up, not what a test is about): its JSON answer."""
        r = await self.http.request(method, path, json=body, params=params, headers=(who or self.admin).auth)
        assert r.status_code < 300, (method, path, r.status_code, r.text)
        return r.json() if r.content else None

    async def department(self, deserved_gpus: float = 8) -> str:
        name = self.name("dept")
        await self.ok("POST", "/api/v1/departments", {"name": name, "deserved_gpus": deserved_gpus})
        return name

    async def project(self, department: str | None = None, deserved_gpus: float = 1, **fields: Any) -> str:
        """A project in `department`, or in a department of its own made for it."""
        parent = department or await self.department(max(deserved_gpus, 1))
        name = self.name("proj")
        body = {"name": name, "department": parent, "deserved_gpus": deserved_gpus, **fields}
        await self.ok("POST", "/api/v1/projects", body)
        return name

    async def user(self, *projects: str, role: str = "member") -> Person:
        name = self.name("user")
        made = await self.ok("POST", "/api/v1/users", {"name": name, "role": role, "projects": list(projects)})
        return Person(name, made["token"])

    async def department_admin(self, department: str) -> Person:
        person = await self.user()
        await self.ok("PUT", f"/api/v1/queues/{department}/members/{person.name}", {"role": "admin"})
        return person

    async def workload(self, project: str, who: Person | None = None, **fields: Any) -> dict[str, Any]:
        body = {"project": project, "name": self.name("job"), "command": ["true"], **fields}
        made: dict[str, Any] = await self.ok("POST", "/api/v1/workloads", body, who)
        return made

    async def until_state(self, workload: dict[str, Any], *states: str, timeout: float = 30) -> dict[str, Any]:
        """Run scheduling cycles (no loop runs in these servers) until the workload is in one of `states`."""
        deadline = time.monotonic() + timeout
        seen: dict[str, Any] = {}
        while time.monotonic() < deadline:
            self.api.ctx.controller.cycle()
            seen = await self.ok("GET", f"/api/v1/workloads/{workload['id']}")
            if seen["state"] in states:
                return seen
            await anyio.sleep(0.05)
        raise AssertionError(f"{workload['name']} not {' or '.join(states)} after {timeout:g}s: {seen}")
