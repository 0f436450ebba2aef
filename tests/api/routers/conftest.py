"""One in-process server per test module and store: the real app, assembled as `gpupool server` assembles it, on a
fresh SQLite file or a fresh PostgreSQL database, called through httpx's ASGI transport.

Every test of a module shares its server. Tests keep out of each other's way by naming everything they make anew
(factories.py) rather than by rolling back: the services commit as they go, and the audit trail writes in a
session of its own, so a per-test transaction would not hold them. A test that runs workloads (scheduling cycles
launch real processes) gets a server of its own (`fresh_api`), so that its cycles start nothing of the others'.

Run one store with `-k sqlite` or `-k postgresql`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.inprocess import Api, make_api
from tests.api.routers.factories import Factory, client

Store = Callable[[], str | None]
"""A new, empty store: its URL (None: SQLite in the server's data dir)."""


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest) -> Store:
    if request.param == "sqlite":
        return lambda: None
    pg = request.getfixturevalue("postgres")
    return lambda: str(pg.new_database())


@pytest.fixture(scope="module")
def api(store: Store, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    api = make_api(tmp_path_factory.mktemp("routers"), db_url=store())
    yield api
    api.close()


@pytest.fixture
def fresh_api(store: Store, tmp_path: Path) -> Iterator[Callable[..., Api]]:
    """Servers of this test's own, on the module's kind of store, with any other settings given."""
    made: list[Api] = []

    def make(**settings: Any) -> Api:
        made.append(make_api(tmp_path / f"server{len(made)}", db_url=store(), **settings))
        return made[-1]

    yield make
    for api in made:
        api.close()


@pytest.fixture
async def http(api: Api) -> AsyncIterator[httpx.AsyncClient]:
    async with client(api) as c:
        yield c


@pytest.fixture
def make(api: Api, http: httpx.AsyncClient) -> Factory:
    return Factory(api, http)
