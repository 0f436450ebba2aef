"""a container image per workload

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workloads") as b:
        b.add_column(sa.Column("image", sa.String(length=512), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workloads") as b:
        b.drop_column("image")
