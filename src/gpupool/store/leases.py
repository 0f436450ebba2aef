"""The leader's lease, and the wake-ups other servers send its holder.

One row per lease name says which server drives the backends (`holder`) and in which term (`epoch`, one more
for every new holder). Its times are the database's clock (PostgreSQL's clock_timestamp(); SQLite's julianday,
one host), so servers whose own clocks disagree still agree on when a lease ran out. Each step is one
statement: taking the lease is an upsert that only replaces a row that has expired, and renewing it (or
fencing a cycle's commit with it) is an update that only matches this holder's epoch, so of two servers racing
for it one wins, and a server that lost it learns so from the row count.

The wake channel is PostgreSQL's LISTEN/NOTIFY: a server that takes a submit but does not lead sends a
notification; every server listens, and the leader's loop runs at once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    CursorResult,
    Engine,
    Float,
    String,
    cast,
    extract,
    func,
    literal,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Mapped, Session, mapped_column

from gpupool.store.tables import Base

CHANNEL = "gpupool_wake"


class LeaseRow(Base):
    __tablename__ = "leases"
    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    holder: Mapped[str] = mapped_column(String(255))
    """Who holds it: host, process id and a random part, unique to one server process's life."""
    epoch: Mapped[int] = mapped_column(BigInteger)
    """The term: each new holder's is one more than the last's. Every commit of a cycle is fenced by it."""
    renewed_at: Mapped[float] = mapped_column(Float)
    """Unix seconds, by the database's clock."""
    expires_at: Mapped[float] = mapped_column(Float)
    """Unix seconds, by the database's clock; 0 once released."""


def db_now(dialect: str) -> ColumnElement[float]:
    """The database's clock in Unix seconds. clock_timestamp(), not now(): a fence runs late in a long
    transaction, and now() is when the transaction began."""
    if dialect == "postgresql":
        return cast(extract("epoch", func.clock_timestamp()), Float)
    return (func.julianday("now") - 2440587.5) * 86400.0


def _dialect(s: Session) -> str:
    return s.get_bind().dialect.name


def _bounded(s: Session, ttl_s: float) -> None:
    """On PostgreSQL, for the rest of this transaction: a wait for the lease's row lock gives up after a fifth of
    the TTL, and a session that holds the lock but stops talking (its server paused or cut off between the update
    and the commit) is ended by the database after half the TTL, so that it cannot keep a standby from taking
    over, and its commit, if it ever comes, fails."""
    if _dialect(s) == "postgresql":
        local = func.set_config  # set_config(name, value, true) is SET LOCAL, with parameters
        lock, idle = str(max(1, int(ttl_s * 200))), str(max(1, int(ttl_s * 500)))
        s.execute(select(local("lock_timeout", lock, True), local("idle_in_transaction_session_timeout", idle, True)))


def acquire(s: Session, name: str, holder: str, ttl_s: float) -> int | None:
    """Take the lease if nobody holds it or its holder's has run out: the new epoch, else None. Not committed."""
    _bounded(s, ttl_s)
    dialect = _dialect(s)
    now = db_now(dialect)
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(LeaseRow).values(name=name, holder=holder, epoch=1, renewed_at=now, expires_at=now + ttl_s)
    stmt = stmt.on_conflict_do_update(
        index_elements=[LeaseRow.name],
        set_={"holder": holder, "epoch": LeaseRow.epoch + 1, "renewed_at": now, "expires_at": now + ttl_s},
        where=LeaseRow.expires_at < now,
    )
    return s.execute(stmt.returning(LeaseRow.epoch)).scalar()


def renew(s: Session, name: str, holder: str, epoch: int, ttl_s: float) -> bool:
    """Extend the lease if it is still this holder's epoch; whether it was. Not committed: inside a cycle's
    transaction this is its fence (on PostgreSQL the row stays locked until the commit, so nobody takes the
    lease between the check and the commit)."""
    _bounded(s, ttl_s)
    now = db_now(_dialect(s))
    stmt = (
        update(LeaseRow)
        .where(LeaseRow.name == name, LeaseRow.holder == holder, LeaseRow.epoch == epoch)
        .values(renewed_at=now, expires_at=now + ttl_s)
        .execution_options(synchronize_session=False)
    )
    done: CursorResult[Any] = s.execute(stmt)  # type: ignore[assignment]
    return done.rowcount == 1


def release(s: Session, name: str, holder: str, epoch: int) -> None:
    """Give the lease up (a server stopping), so a standby need not wait for it to run out. Not committed."""
    stmt = (
        update(LeaseRow)
        .where(LeaseRow.name == name, LeaseRow.holder == holder, LeaseRow.epoch == epoch)
        .values(expires_at=0.0)
        .execution_options(synchronize_session=False)
    )
    s.execute(stmt)


def current(s: Session, name: str) -> LeaseRow | None:
    return s.get(LeaseRow, name, populate_existing=True)


class WakeChannel:
    """LISTEN/NOTIFY on one PostgreSQL database. `send` only flags: a thread of its own sends the notification,
    so a caller on the API's event loop never waits on the database, and a burst of submits costs a few
    notifications, not one each."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._pending = threading.Event()

    def send(self) -> None:
        self._pending.set()

    def sender(self, stop: threading.Event) -> None:
        """Runs until `stop`; raises when the database cannot be reached (the caller retries)."""
        while not stop.is_set():
            if not self._pending.wait(0.5):
                continue
            self._pending.clear()
            with self.engine.connect() as conn:
                conn.execute(select(func.pg_notify(literal(CHANNEL), literal(""))))
                conn.commit()

    def listen(self, stop: threading.Event, on_wake: Callable[[], None]) -> None:
        """Calls `on_wake` for each notification until `stop`, on a connection of its own (outside the pool: it
        is held for good); raises when the connection fails (the caller reconnects)."""
        import psycopg  # only PostgreSQL listens: gpupool[server] alone (SQLite) has no psycopg

        args, kwargs = self.engine.dialect.create_connect_args(self.engine.url)
        kwargs.pop("context", None)
        # Keepalives: a listener that only reads would otherwise not notice a database that went away.
        kwargs.setdefault("connect_timeout", 5)
        kwargs.update(keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=3)
        with psycopg.connect(*args, autocommit=True, **kwargs) as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            while not stop.is_set():
                for _ in conn.notifies(timeout=1.0):
                    on_wake()
