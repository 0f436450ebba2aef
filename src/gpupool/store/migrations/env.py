"""Alembic environment: the caller hands over a connection (gpupool.store.engine.migrate)."""

from alembic import context

from gpupool.store.tables import Base

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only the programmatic path is supported
    raise RuntimeError("run migrations through gpupool.store.engine.migrate()")
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
