"""burst nodes (one per ProvisioningRequest: who pays, its phase, its node, its bill), the burst price of usage,
a department's pacing and stop at its budget, and its last refusal

Revision ID: 0021
Revises: 0020
"""

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "burst_nodes",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("cluster", sa.String(63), nullable=False),
        sa.Column("department", sa.String(63), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("price_micro", sa.BigInteger(), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("end_reason", sa.String(16), nullable=True),
        sa.Column("node", sa.String(253), nullable=True),
        sa.Column("for_workloads", sa.JSON(), nullable=False),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("asked_at", sa.Float(), nullable=False),
        sa.Column("ready_at", sa.Float(), nullable=True),
        sa.Column("idle_since", sa.Float(), nullable=True),
        sa.Column("released_at", sa.Float(), nullable=True),
    )
    op.create_index("ix_burst_nodes_cluster", "burst_nodes", ["cluster"])
    op.create_index("ix_burst_nodes_department", "burst_nodes", ["department"])
    op.create_index("ix_burst_nodes_phase", "burst_nodes", ["phase"])
    op.add_column("usage", sa.Column("burst_price_micro", sa.BigInteger(), nullable=True))
    op.add_column("queues", sa.Column("burst_paced", sa.Boolean(), nullable=False, server_default=sa.true()))
    op.add_column("queues", sa.Column("burst_stop_at_budget", sa.Boolean(), nullable=False, server_default=sa.true()))
    op.add_column("queues", sa.Column("burst_refused", sa.String(16), nullable=True))
    op.add_column("queues", sa.Column("burst_refused_at", sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column("queues", "burst_refused_at")
    op.drop_column("queues", "burst_refused")
    op.drop_column("queues", "burst_stop_at_budget")
    op.drop_column("queues", "burst_paced")
    op.drop_column("usage", "burst_price_micro")
    op.drop_table("burst_nodes")
