"""workload versions: a stamp on every write of a workload row (the scheduler reads only what changed since its
last look; a writer checks nobody wrote a row since it read it), and indexes for lists paged by id

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Rows of before start at 0: a scheduler starting on this store reads every row once anyway.
    with op.batch_alter_table("workloads") as b:
        b.add_column(sa.Column("version", sa.BigInteger(), nullable=False, server_default="0"))
        b.create_index("ix_workloads_version", ["version"], unique=False)
        b.drop_index("ix_workloads_project_id")
        b.drop_index("ix_workloads_state")
        b.create_index("ix_workloads_project_id_id", ["project_id", "id"], unique=False)
        b.create_index("ix_workloads_state_id", ["state", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("workloads") as b:
        b.drop_index("ix_workloads_state_id")
        b.drop_index("ix_workloads_project_id_id")
        b.create_index("ix_workloads_state", ["state"], unique=False)
        b.create_index("ix_workloads_project_id", ["project_id"], unique=False)
        b.drop_index("ix_workloads_version")
        b.drop_column("version")
