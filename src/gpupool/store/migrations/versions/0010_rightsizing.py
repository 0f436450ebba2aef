"""right-sizing: each workload's peak GPU memory (of its largest member) and peak utilisation, kept as samples
arrive

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Rows of before stay NULL (never sampled since): they get no advice until samples arrive.
    with op.batch_alter_table("workloads") as b:
        b.add_column(sa.Column("gpu_memory_peak_mib", sa.BigInteger(), nullable=True))
        b.add_column(sa.Column("gpu_util_peak_pct", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workloads") as b:
        b.drop_column("gpu_util_peak_pct")
        b.drop_column("gpu_memory_peak_mib")
