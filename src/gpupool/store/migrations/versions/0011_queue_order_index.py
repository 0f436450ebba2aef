"""an index in queue order per project, so describe counts a queued workload's place from the index alone

Revision ID: 0011
Revises: 0010
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_workloads_queue_order", "workloads", ["project_id", "state", "hold", "priority", "queued_at", "id"]
    )


def downgrade() -> None:
    op.drop_index("ix_workloads_queue_order", table_name="workloads")
