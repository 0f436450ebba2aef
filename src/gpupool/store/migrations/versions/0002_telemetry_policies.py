"""telemetry, idle policies, usage and passwords

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("queues") as b:
        b.add_column(sa.Column("policy", sa.JSON(), nullable=False, server_default="{}"))
    with op.batch_alter_table("users") as b:
        b.add_column(sa.Column("password_hash", sa.String(length=255), nullable=True))
    with op.batch_alter_table("workloads") as b:
        b.add_column(sa.Column("hold", sa.Boolean(), nullable=False, server_default=sa.false()))
        b.add_column(sa.Column("gpu_util_pct", sa.Integer(), nullable=True))
        b.add_column(sa.Column("gpu_memory_used_mib", sa.BigInteger(), nullable=True))
        b.add_column(sa.Column("idle_since", sa.Float(), nullable=True))
    op.create_table(
        "usage",
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("minute", sa.BigInteger(), nullable=False),
        sa.Column("pool", sa.String(length=63), nullable=False),
        sa.Column("milli_seconds", sa.Float(), nullable=False),
        sa.Column("busy_milli_seconds", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["workload_id"], ["workloads.id"]),
        sa.PrimaryKeyConstraint("workload_id", "minute"),
    )
    op.create_index("ix_usage_minute", "usage", ["minute"])


def downgrade() -> None:
    op.drop_index("ix_usage_minute", table_name="usage")
    op.drop_table("usage")
    with op.batch_alter_table("workloads") as b:
        for col in ("idle_since", "gpu_memory_used_mib", "gpu_util_pct", "hold"):
            b.drop_column(col)
    with op.batch_alter_table("users") as b:
        b.drop_column("password_hash")
    with op.batch_alter_table("queues") as b:
        b.drop_column("policy")
