"""workloads adopted from Kubernetes pods: their origin, unique by the pod's uid

Revision ID: 0017
Revises: 0016
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("workloads", sa.Column("origin", sa.JSON(), nullable=True))
    op.add_column("workloads", sa.Column("origin_uid", sa.String(64), nullable=True))
    # A unique index rather than a constraint: SQLite adds one without rebuilding the table.
    op.create_index("uq_workloads_origin_uid", "workloads", ["origin_uid"], unique=True)


def downgrade() -> None:
    op.drop_index("uq_workloads_origin_uid", table_name="workloads")
    op.drop_column("workloads", "origin_uid")
    op.drop_column("workloads", "origin")
