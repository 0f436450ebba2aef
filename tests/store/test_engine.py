"""The engines' fault handling, on real stores: PostgreSQL's connections carry their timeouts and keepalives and
a dead one is replaced; a SQLite connection that met a read-only file or a full disk is dropped, not kept."""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError

from gpupool.store.engine import make_engine, migrate
from tests.e2e.postgres import Postgres


@pytest.fixture
def pg_engine(postgres: Postgres) -> Iterator[Engine]:
    engine = make_engine(postgres.new_database())
    yield engine
    engine.dispose()


def test_a_postgresql_connection_has_a_statement_timeout_keepalives_and_a_user_timeout(pg_engine: Engine) -> None:
    migrate(pg_engine)  # with its own timeout, which does not outlive it
    with pg_engine.connect() as conn:
        assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "30s"
        fd = conn.connection.dbapi_connection.pgconn.socket  # type: ignore[union-attr]
        sock = socket.socket(fileno=fd)
        try:
            options = [
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
            ]
        finally:
            sock.detach()  # the descriptor is the driver's
    assert options == [1, 10, 3, 3, 10_000]
    assert (pg_engine.pool.timeout(), pg_engine.dialect.name) == (2.0, "postgresql")  # type: ignore[attr-defined]


def test_a_postgresql_connection_whose_server_process_died_is_dropped_and_the_next_one_works(
    pg_engine: Engine,
) -> None:
    with pg_engine.connect() as victim, pg_engine.connect() as killer:
        pid = victim.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        killer.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid or 0)})")
        with pytest.raises(OperationalError) as failed:
            victim.exec_driver_sql("SELECT 1")
        assert failed.value.connection_invalidated
    with pg_engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT pg_backend_pid()").scalar() != pid


@contextlib.contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A small disk of its own, to fill or make read-only (the tests run as root, as the sandbox's do)."""
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        for f in where.iterdir():
            subprocess.run(["chattr", "-i", str(f)], capture_output=True)  # immutable files would stay
        subprocess.run(["umount", "-l", str(where)], check=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "disk", "1m") as where:
        yield where


def _sqlite(where: Path) -> Engine:
    engine = make_engine(f"sqlite:///{where / 'db.sqlite'}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (x TEXT)"))
    engine.dispose()  # the next connection is opened afresh
    return engine


def _insert(engine: Engine, value: str) -> None:
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO t VALUES (:v)"), {"v": value})


def test_a_sqlite_connection_opened_on_a_read_only_file_is_dropped_once_it_fails(small_disk: Path) -> None:
    """SQLite opens a file it may not write read-only, for the connection's life. As root, `chattr +i` is what a
    read-only file is to other users."""
    engine = _sqlite(small_disk)
    subprocess.run(["chattr", "+i", str(small_disk / "db.sqlite")], check=True)
    with pytest.raises(OperationalError, match="readonly database") as failed:
        _insert(engine, "refused")
    assert failed.value.connection_invalidated
    subprocess.run(["chattr", "-i", str(small_disk / "db.sqlite")], check=True)
    _insert(engine, "kept")  # on a connection opened now: the read-only one is gone
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT x FROM t").scalars().all() == ["kept"]
    engine.dispose()


def test_a_sqlite_connection_that_met_a_full_disk_is_dropped_and_writes_resume_once_space_is_freed(
    small_disk: Path,
) -> None:
    engine = _sqlite(small_disk)
    reader = engine.connect()  # keeps the WAL and its index, as a running server does
    reader.exec_driver_sql("SELECT 1")
    with contextlib.suppress(OSError), open(small_disk / "filler", "wb") as f:
        while True:
            f.write(b"\0" * 4096)
            f.flush()
    with pytest.raises(OperationalError, match="database or disk is full") as failed:
        _insert(engine, "x" * 8192)
    assert failed.value.connection_invalidated
    reader.close()
    (small_disk / "filler").unlink()
    _insert(engine, "kept")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
        assert conn.exec_driver_sql("SELECT x FROM t").scalars().all() == ["kept"]
    engine.dispose()


def test_a_sqlite_statement_error_is_not_taken_for_a_fault(tmp_path: Path) -> None:
    engine = _sqlite(tmp_path)
    with engine.connect() as conn:
        with pytest.raises(OperationalError, match="no such table") as failed:
            conn.exec_driver_sql("SELECT * FROM missing")
        assert not failed.value.connection_invalidated
    engine.dispose()


@pytest.mark.parametrize(("query", "level"), [("", 1), ("?synchronous=full", 2), ("?synchronous=NORMAL", 1)])
def test_sqlite_syncs_the_wal_at_checkpoints_unless_the_url_asks_for_every_commit(
    tmp_path: Path, query: str, level: int
) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}{query}")
    with engine.connect() as conn:
        assert (conn.exec_driver_sql("PRAGMA synchronous").scalar(), engine.url.query) == (level, {})
    engine.dispose()


def test_a_sqlite_url_asking_for_another_synchronous_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--db: synchronous=off: expected one of normal, full"):
        make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}?synchronous=off")
