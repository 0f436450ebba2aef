"""leases: the leader's lease (which server drives the backends, in which epoch) for replicas on one PostgreSQL

Its model is gpupool.store.leases.LeaseRow.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("holder", sa.String(length=255), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("renewed_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    op.drop_table("leases")
