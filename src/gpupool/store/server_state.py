"""Server-wide state kept in the store, so every replica reads the same and an empty data dir loses none of it:
the key that signs portal and single sign-on values, and where the first start's bootstrap stands."""

from __future__ import annotations

from sqlalchemy import Float, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.store.tables import Base


class ServerStateRow(Base):
    """One named value (the session secret in hex; the bootstrap as JSON)."""

    __tablename__ = "server_state"
    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[float] = mapped_column(Float)
