"""the Kubernetes pods each adopted workload's members are (a gang's several)

Revision ID: 0018
Revises: 0017
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "workload_pods",
        sa.Column("pod_uid", sa.String(64), primary_key=True),
        sa.Column("workload_id", sa.Integer(), sa.ForeignKey("workloads.id"), nullable=False),
        sa.Column("member", sa.Integer(), nullable=False),
    )
    op.create_index("ix_workload_pods_workload_id", "workload_pods", ["workload_id"])
    # The pods adopted before gangs, one per workload.
    op.execute(
        "INSERT INTO workload_pods (pod_uid, workload_id, member) "
        "SELECT origin_uid, id, 0 FROM workloads WHERE origin_uid IS NOT NULL"
    )


def downgrade() -> None:
    op.drop_index("ix_workload_pods_workload_id", table_name="workload_pods")
    op.drop_table("workload_pods")
