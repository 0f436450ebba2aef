"""Server-wide state kept in the store, so every replica reads the same and an empty data dir loses none of it:
the key that signs the values a browser keeps for single sign-on, and where the first start's bootstrap stands.

Each value is made once: of servers racing to make it, one insert wins and the others read the winner's (an
insert that skips a row that exists, on SQLite and PostgreSQL alike). A value that changes changes by compare
and swap, so two servers never both act on one old state."""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import Float, String, Text, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Mapped, Session, mapped_column

from gpupool.store.tables import Base

SESSION_SECRET = "session_secret"
BOOTSTRAP = "bootstrap"


class ServerStateRow(Base):
    """One named value (the session secret in hex; the bootstrap as JSON)."""

    __tablename__ = "server_state"
    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[float] = mapped_column(Float)


def read(session: Session, name: str) -> str | None:
    return session.scalar(
        select(ServerStateRow.value).where(ServerStateRow.name == name).execution_options(populate_existing=True)
    )


def insert_once(session: Session, name: str, value: str) -> bool:
    """Insert the value unless the name has one; whether this call inserted it. Not committed: the caller may
    add more to the same transaction. On PostgreSQL a racing insert waits for this transaction, then skips."""
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(ServerStateRow).values(name=name, value=value, updated_at=time.time())
    done = session.execute(stmt.on_conflict_do_nothing(index_elements=["name"]).returning(ServerStateRow.name))
    return done.first() is not None  # a row back: inserted (an ORM insert's rowcount says nothing on psycopg)


def replace(session: Session, name: str, old: str, new: str) -> bool:
    """Set the value to `new` if it is still `old`; whether it was. Not committed."""
    done = session.execute(
        update(ServerStateRow)
        .where(ServerStateRow.name == name, ServerStateRow.value == old)
        .values(value=new, updated_at=time.time())
        .returning(ServerStateRow.name)
    )
    return done.first() is not None


def get_or_create(session: Session, name: str, make: Callable[[], str]) -> str:
    """The value, made with `make` and committed by the first server to ask; every other reads that one."""
    found = read(session, name)
    if found is not None:
        return found
    insert_once(session, name, make())
    session.commit()
    found = read(session, name)
    if found is None:  # pragma: no cover - a row is never deleted
        raise RuntimeError(f"server state {name!r} vanished")
    return found
