"""the GPU models a workload accepts, lists by owner, and the GPU memory a workload used in each minute

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(sa.Column("gpu_models", sa.JSON(), nullable=False, server_default="[]"))
        batch.create_index("ix_workloads_owner_id", ["owner_id", "id"])
    with op.batch_alter_table("usage") as batch:
        batch.add_column(sa.Column("gpu_memory_mib", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage") as batch:
        batch.drop_column("gpu_memory_mib")
    with op.batch_alter_table("workloads") as batch:
        batch.drop_index("ix_workloads_owner_id")
        batch.drop_column("gpu_models")
