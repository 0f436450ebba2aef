"""The migrations build exactly the schema the models describe, on SQLite and on PostgreSQL, and run twice."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text

from gpupool.services.auth import authenticate, hash_token
from gpupool.store.engine import make_engine, migrate, session_factory
from gpupool.store.tables import Base
from tests.e2e.postgres import Postgres
from tests.store.revisions import at_revision


def _database(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'db.sqlite'}"
    pg: Postgres = request.getfixturevalue("postgres")
    return pg.new_database()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migrations_match_the_models(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    engine = make_engine(_database(backend, tmp_path, request))
    migrate(engine)
    migrate(engine)  # idempotent: a restart runs it again
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_tenancy_keeps_every_users_token_and_viewers_stay_viewers(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    engine = make_engine(_database(backend, tmp_path, request))
    with at_revision(engine, "0004") as conn:
        conn.execute(text("INSERT INTO queues (name, kind, strict_fifo, policy, created_at) "
                          "VALUES ('lab', 'project', false, '{}', 0)"))  # fmt: skip
        for uid, name, role in ((1, "ana", "member"), (2, "vic", "viewer")):
            conn.execute(
                text("INSERT INTO users (id, name, role, token_hash, created_at) VALUES (:i, :n, :r, :h, 0)"),
                {"i": uid, "n": name, "r": role, "h": hash_token(f"gp_{name}")},
            )
            conn.execute(text("INSERT INTO memberships (user_id, project_id) VALUES (:i, 1)"), {"i": uid})
    migrate(engine)
    with session_factory(engine)() as s:
        ana, vic = authenticate(s, "gp_ana"), authenticate(s, "gp_vic")
        assert ana is not None and vic is not None
        assert (dict(ana.projects), dict(vic.projects)) == ({1: "member"}, {1: "viewer"})
