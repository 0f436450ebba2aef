"""Engines and schema migrations for SQLite (embedded, WAL) and PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).parent / "migrations"


def make_engine(url: str) -> Engine:
    """An engine for a SQLAlchemy URL; SQLite gets WAL and a busy timeout so the API and the loop share it."""
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest revision (idempotent)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:
            # A batch migration rebuilds a table that others point at; SQLite checks foreign keys on the DROP
            # of the old copy, so they are off while migrating (as Alembic's batch mode asks), and on after.
            conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
            conn.commit()  # ends SQLAlchemy's autobegun transaction; the pragma holds for the connection
        with conn.begin():
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
        if sqlite:
            conn.exec_driver_sql("PRAGMA foreign_keys=ON")
            conn.commit()


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)
