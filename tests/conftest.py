"""Fixtures shared by every test package: a throwaway PostgreSQL server for the session."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.postgres import Postgres


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
