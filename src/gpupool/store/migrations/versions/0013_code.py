"""code goes with the job: a workload's code manifest, and the blobs and manifests each project uploaded

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(sa.Column("code", sa.String(71), nullable=True))
        batch.create_index("ix_workloads_code", ["code"])
    op.create_table(
        "code_blobs",
        sa.Column("project_id", sa.Integer(), sa.ForeignKey("queues.id"), primary_key=True),
        sa.Column("digest", sa.String(71), primary_key=True),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_code_blobs_digest", "code_blobs", ["digest"])
    op.create_table(
        "code_manifests",
        sa.Column("project_id", sa.Integer(), sa.ForeignKey("queues.id"), primary_key=True),
        sa.Column("digest", sa.String(71), primary_key=True),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("chunks", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(63), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("code_manifests")
    op.drop_index("ix_code_blobs_digest", "code_blobs")
    op.drop_table("code_blobs")
    with op.batch_alter_table("workloads") as batch:
        batch.drop_index("ix_workloads_code")
        batch.drop_column("code")
