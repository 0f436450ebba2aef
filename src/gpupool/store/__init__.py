"""gpupool's store: SQLAlchemy rows, Alembic migrations, the snapshot builder and the decision writer."""
