"""Fixtures shared by every test package: a throwaway PostgreSQL server for the session, and a migrated store on
each of SQLite and PostgreSQL."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from gpupool.store.engine import make_engine, migrate
from tests import uids
from tests.e2e.postgres import Postgres


@pytest.fixture(scope="session", autouse=True)
def uid_base() -> Iterator[None]:
    """Root servers a test starts without --uid-base take this worker's range (tests/uids.py)."""
    before = os.environ.get("GPUPOOL_UID_BASE")
    os.environ["GPUPOOL_UID_BASE"] = str(uids.default_base())
    yield
    if before is None:
        os.environ.pop("GPUPOOL_UID_BASE", None)
    else:
        os.environ["GPUPOOL_UID_BASE"] = before


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    # Not under pytest's temp root: that is private to this user, and PostgreSQL runs as its own.
    root = Path(tempfile.mkdtemp(prefix="gpupool-pg-"))
    pg = Postgres(root)
    pg.start()
    try:
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def migrated_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """An engine on an empty store at the newest revision: SQLite in the test's dir, or a new PostgreSQL database."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    else:
        pg: Postgres = request.getfixturevalue("postgres")
        url = pg.new_database()
    engine = make_engine(url)
    migrate(engine)
    yield engine
    engine.dispose()
