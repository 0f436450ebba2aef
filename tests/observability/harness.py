"""The real app and store in-process, its scheduler loop driven by hand on a clock the test moves, and real
processes (sleeps) on simulated GPUs: what a scripted scenario needs to cause each kind of stop on purpose."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from gpupool.store.tables import WorkloadRow
from tests.api.inprocess import Api, make_api


class Clock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


class Cluster:
    def __init__(self, api: Api, clock: Clock) -> None:
        self.api, self.clock = api, clock
        self.controller = api.ctx.controller
        self.controller.clock = clock
        self.controller.telemetry_interval_s = 1.0  # a sample in every cycle: they are a second apart or more

    def http(self, method: str, path: str, body: Any = None, token: str | None = None) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.api.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
                return await c.request(method, path, json=body, headers=self.api.auth(token))

        return asyncio.run(go())

    def submit(self, project: str, name: str, kind: str, priority: str) -> None:
        body = {"project": project, "name": name, "type": kind, "priority": priority, "gpus": 1, "grace_s": 5,
                "command": ["sleep", "600"]}  # fmt: skip
        r = self.http("POST", "/api/v1/workloads", body)
        assert r.status_code == 201, r.text

    def states(self) -> dict[str, str]:
        with self.api.ctx.sessions() as s:
            return {w.name: w.state for w in s.scalars(select(WorkloadRow))}

    def row(self, name: str) -> WorkloadRow:
        with self.api.ctx.sessions() as s:
            found = s.scalar(select(WorkloadRow).where(WorkloadRow.name == name))
            assert found is not None
            return found

    def cycle(self, advance: float = 1.0) -> None:
        self.clock.now += advance
        self.controller.cycle()

    def until(self, check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
        """Cycles a second of the test's clock apart until `check` holds (real processes start and end in real
        time, so this polls, up to `timeout` real seconds)."""
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.states()}"
            self.cycle()
            time.sleep(0.02)

    def stop_everything(self) -> None:
        backend = self.api.ctx.backend
        for alloc_id, seen in (backend.observe() or {}).items():
            if seen.alive:
                backend.stop(alloc_id, force=True)


@contextmanager
def cluster(root: Path) -> Iterator[Cluster]:
    c = Cluster(make_api(root, "fake:4xH100-80GB"), Clock(time.time()))
    try:
        yield c
    finally:
        c.stop_everything()
