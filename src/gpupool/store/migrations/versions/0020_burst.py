"""burst clusters (their price, delay, size and idle release) and departments' burst thresholds and budgets

Revision ID: 0020
Revises: 0019
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("clusters", sa.Column("burst", sa.JSON(), nullable=True))
    op.add_column("queues", sa.Column("burst_after_s", sa.Float(), nullable=True))
    op.add_column("queues", sa.Column("burst_budget_micro", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("queues", "burst_budget_micro")
    op.drop_column("queues", "burst_after_s")
    op.drop_column("clusters", "burst")
