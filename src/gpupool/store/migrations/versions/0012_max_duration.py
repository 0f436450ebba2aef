"""a workload's declared max duration (enforced), and a queued workload's estimated start and what it rests on

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(sa.Column("max_duration_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("eta", sa.Float(), nullable=True))
        batch.add_column(sa.Column("eta_basis", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.drop_column("eta_basis")
        batch.drop_column("eta")
        batch.drop_column("max_duration_s")
