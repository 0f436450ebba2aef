"""gpupool's store: SQLAlchemy rows, Alembic migrations, the snapshot builder and the decision writer."""

from gpupool.store import leases as leases  # the leader lease table, likewise
from gpupool.store import server_state as server_state  # its row is part of Base.metadata wherever the store is
