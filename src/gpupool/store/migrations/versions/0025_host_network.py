"""a project's local workloads may share the host's network, where an admin grants it

Revision ID: 0025
Revises: 0024
"""

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("queues") as b:
        b.add_column(sa.Column("host_network", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("queues") as b:
        b.drop_column("host_network")
