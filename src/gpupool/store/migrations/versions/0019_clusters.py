"""clusters (the hub's spokes), the cluster of each node, a workload's clusters and its policy when one is lost,
and launches abandoned on a lost cluster

Revision ID: 0019
Revises: 0018
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "clusters",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("kubeconfig", sa.Text(), nullable=True),
        sa.Column("pool_label", sa.String(253), nullable=True),
        sa.Column("pool_scope", sa.String(16), nullable=False, server_default="global"),
        sa.Column("draining", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("status", sa.String(16), nullable=False, server_default="unknown"),
        sa.Column("last_seen_at", sa.Float(), nullable=True),
        sa.Column("down_since", sa.Float(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )
    # Added columns and indexes only: SQLite takes them without rebuilding a table.
    op.add_column("nodes", sa.Column("cluster", sa.String(63), nullable=False, server_default=""))
    op.add_column("workloads", sa.Column("clusters", sa.JSON(), nullable=False, server_default="[]"))
    op.add_column("workloads", sa.Column("cluster_lost_after_s", sa.Float(), nullable=True))
    op.add_column("allocations", sa.Column("abandoned_at", sa.Float(), nullable=True))
    op.create_index("ix_allocations_abandoned_at", "allocations", ["abandoned_at"])


def downgrade() -> None:
    op.drop_index("ix_allocations_abandoned_at", table_name="allocations")
    op.drop_column("allocations", "abandoned_at")
    op.drop_column("workloads", "cluster_lost_after_s")
    op.drop_column("workloads", "clusters")
    op.drop_column("nodes", "cluster")
    op.drop_table("clusters")
