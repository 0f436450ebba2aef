"""The migrations build exactly the schema the models describe, on SQLite and on PostgreSQL, and run twice."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from gpupool.store.engine import make_engine, migrate
from gpupool.store.tables import Base
from tests.e2e.postgres import Postgres


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migrations_match_the_models(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    else:
        pg: Postgres = request.getfixturevalue("postgres")
        url = pg.new_database()
    engine = make_engine(url)
    migrate(engine)
    migrate(engine)  # idempotent: a restart runs it again
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []
