"""Engines and schema migrations for SQLite (embedded, WAL) and PostgreSQL, with the timeouts and fault handling
that let a server degrade and recover by itself when its store goes away (docs/operations.md, store faults)."""

from __future__ import annotations

import faulthandler
import sqlite3
import sys
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).parent / "migrations"

STATEMENT_TIMEOUT_MS = 30_000
"""PostgreSQL cancels a statement after this long. It bounds a query stuck behind a lock or gone wild; a hung
server is caught sooner by the API's store watch, which cannot rely on the server to time itself out."""

POSTGRES_CONNECT_ARGS: dict[str, Any] = {
    "connect_timeout": 2,  # seconds; libpq's smallest
    # A peer that vanished (host down, network cut) is found on an idle connection within 10 + 3 * 3 s, and a
    # sent request unacknowledged for 10 s fails, instead of waiting for the kernel's 15-minute retransmissions.
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 3,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,  # milliseconds
    "options": f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
}

POOL_TIMEOUT_S = 2.0
"""How long a request waits for a pooled connection before it is answered 503."""

SQLITE_FAULTS = frozenset({sqlite3.SQLITE_READONLY, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN})
"""SQLite's primary result codes that say the file or its disk is at fault, not the statement: a connection that
met one is dropped (one opened while the file was read-only stays read-only for life)."""


def sqlite_fault(exc: BaseException | None) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.Error) and code is not None and code & 0xFF in SQLITE_FAULTS


def _drop_faulty_sqlite(context: ExceptionContext) -> None:
    """Marks a file or disk fault as a disconnect, so the pool drops this connection and the ones it holds, and
    the next use opens the file afresh."""
    if sqlite_fault(context.original_exception):
        context.is_disconnect = True


SYNCHRONOUS = ("normal", "full")
"""SQLite's `synchronous` settings a URL may ask for (`sqlite:///path?synchronous=full`); docs/operations.md says
what each costs and what a power loss can take."""
DEFAULT_SYNCHRONOUS = "normal"


def sqlite_synchronous(url: str) -> str:
    """The `synchronous` a SQLite URL asks for; ValueError, with a sentence, for one not in SYNCHRONOUS."""
    value = str(make_url(url).query.get("synchronous", DEFAULT_SYNCHRONOUS)).lower()
    if value not in SYNCHRONOUS:
        raise ValueError(f"--db: synchronous={value[:20]}: expected one of {', '.join(SYNCHRONOUS)}")
    return value


def make_engine(url: str) -> Engine:
    """An engine for a SQLAlchemy URL; SQLite gets WAL and a busy timeout so the API and the loop share it."""
    if not faulthandler.is_enabled() and sys.stderr is not None:
        # SQLite maps its -shm file into memory: a fault on it is SIGBUS, which kills the process with no word.
        # faulthandler writes every thread's stack to stderr (the server's log) first.
        faulthandler.enable()
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    if url.startswith("sqlite"):
        synchronous = sqlite_synchronous(url)
        parsed = make_url(url).difference_update_query(["synchronous"])
        engine = create_engine(parsed, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA synchronous={synchronous.upper()}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        event.listen(engine, "handle_error", _drop_faulty_sqlite)
        return engine
    return create_engine(
        url,
        connect_args=POSTGRES_CONNECT_ARGS if url.startswith("postgresql") else {},
        pool_pre_ping=True,
        pool_size=10,
        max_overflow=20,
        pool_timeout=POOL_TIMEOUT_S,
    )


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
            if conn.dialect.name == "postgresql":
                # A migration may rewrite a large table: the statement timeout is for requests, not for this.
                conn.exec_driver_sql("SET LOCAL statement_timeout = 0")
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
        if sqlite:
            conn.exec_driver_sql("PRAGMA foreign_keys=ON")
            conn.commit()


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)
