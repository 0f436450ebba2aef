"""A store as an older release left it: migrated up to a revision, for rows written as that release wrote them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine

from gpupool.store.engine import MIGRATIONS


@contextmanager
def at_revision(engine: Engine, revision: str) -> Iterator[Connection]:
    """A connection, in one transaction, on the schema of `revision`."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
        yield conn
