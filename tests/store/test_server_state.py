"""Server-wide state in the store: the session key and the first start's admin are made once, by one of any
number of servers starting together, and survive a data dir that is emptied; on SQLite and on PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session, sessionmaker

from gpupool.services.auth import authenticate
from gpupool.services.sessions import first_admin, session_key
from gpupool.store import server_state
from gpupool.store.engine import make_engine, migrate, session_factory
from gpupool.store.tables import TokenRow, UserRow
from tests.e2e.postgres import Postgres
from tests.store.revisions import at_revision

T = TypeVar("T")


def _database(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'db.sqlite'}"
    pg: Postgres = request.getfixturevalue("postgres")
    return pg.new_database()


def _store(url: str) -> sessionmaker[Session]:
    engine = make_engine(url)
    migrate(engine)
    return session_factory(engine)


BACKENDS = pytest.mark.parametrize("backend", ["sqlite", "postgresql"])


def _together(n: int, url: str, work: Callable[[Session], T]) -> list[T]:
    """`work` run by n servers at once, each with an engine (a connection pool) of its own."""
    stores = [_store(url) for _ in range(n)]
    start = threading.Barrier(n)
    out: list[T | BaseException] = [RuntimeError("did not run")] * n

    def one(i: int) -> None:
        start.wait()
        try:
            with stores[i]() as s:
                out[i] = work(s)
        except BaseException as e:
            out[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    errors = [r for r in out if isinstance(r, BaseException)]
    assert errors == []
    return out  # type: ignore[return-value]


@BACKENDS
def test_servers_starting_together_share_one_session_key(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = _database(backend, tmp_path, request)
    keys = _together(4, url, lambda s: session_key(s))
    assert len(keys[0]) == 32 and keys == [keys[0]] * 4
    with _store(url)() as s:
        assert session_key(s, "ab" * 32) == keys[0]  # a data dir's old key never replaces the store's


@BACKENDS
def test_a_key_kept_in_a_data_dir_before_moves_into_the_store(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with _store(_database(backend, tmp_path, request))() as s:
        assert session_key(s, "ab" * 32) == bytes.fromhex("ab" * 32)
        assert session_key(s, None) == bytes.fromhex("ab" * 32)


@BACKENDS
def test_servers_starting_together_on_an_empty_store_make_one_admin(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = _database(backend, tmp_path, request)
    tokens = _together(4, url, lambda s: first_admin(s, None))
    assert None not in tokens and len(set(tokens)) == 4  # each server keeps a token of its own in its data dir
    with _store(url)() as s:
        assert s.scalars(select(UserRow.name)).all() == ["admin"]
        assert s.scalar(select(func.count()).select_from(TokenRow)) == 4
        names = [who.name if (who := authenticate(s, str(t))) else None for t in tokens]
        assert names == ["admin"] * 4


@BACKENDS
def test_the_first_start_ends_when_its_token_is_used_even_with_an_empty_data_dir(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    sessions = _store(_database(backend, tmp_path, request))
    with sessions() as s:
        first = first_admin(s, None)
        assert first is not None
        assert first_admin(s, first) == first  # its file is still there: kept
        second = first_admin(s, None)  # restarted with an empty data dir before anyone read the file
        assert second is not None and second != first
        who = authenticate(s, second)  # the admin signs in with the new one
        assert who is not None and who.name == "admin"
        assert first_admin(s, None) is None  # the first start is over: no token, with or without a data dir
        assert first_admin(s, second) is None
        assert authenticate(s, first) is None  # the one nobody used is revoked
        assert authenticate(s, second) is not None
        assert s.scalars(select(UserRow.name)).all() == ["admin"]


@BACKENDS
def test_another_admin_ends_the_first_start(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    sessions = _store(_database(backend, tmp_path, request))
    with sessions() as s:
        token = first_admin(s, None)
        assert token is not None
        s.add(UserRow(name="ops", role="admin", kind="person", issuer="https://idp", subject="1", created_at=0))
        s.commit()
        assert first_admin(s, token) is None
        assert authenticate(s, token) is None


@BACKENDS
def test_a_store_made_before_the_state_moved_there_never_bootstraps(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    engine = make_engine(_database(backend, tmp_path, request))
    with at_revision(engine, "0005") as conn:
        conn.execute(text("INSERT INTO users (name, role, kind, created_at) VALUES ('admin', 'admin', 'person', 0)"))
    migrate(engine)
    with session_factory(engine)() as s:
        assert server_state.read(s, server_state.BOOTSTRAP) == '{"state": "done"}'
        assert first_admin(s, None) is None
        assert s.scalar(select(func.count()).select_from(TokenRow)) == 0
