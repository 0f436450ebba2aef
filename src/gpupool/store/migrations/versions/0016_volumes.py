"""project volumes

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "volumes",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("project_id", sa.Integer(), sa.ForeignKey("queues.id"), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(63), nullable=False),
        sa.UniqueConstraint("project_id", "name", name="uq_volumes_project_name"),
    )
    op.create_index("ix_volumes_project_id", "volumes", ["project_id"])


def downgrade() -> None:
    op.drop_index("ix_volumes_project_id", table_name="volumes")
    op.drop_table("volumes")
