"""names unique among live workloads only (live_name), what was submitted (spec and its hash, for rerun and
apply), a retry policy with the time a retry's backoff ends, each workload's ended attempts, and deletion

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_TERMINAL = ("succeeded", "failed", "cancelled")


def upgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(sa.Column("live_name", sa.String(63), nullable=True))
        batch.add_column(sa.Column("spec", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("spec_hash", sa.String(64), nullable=True))
        batch.add_column(sa.Column("retry", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("retry_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("attempts", sa.JSON(), nullable=False, server_default="[]"))
        batch.add_column(sa.Column("deleted_at", sa.Float(), nullable=True))
    workloads = sa.table("workloads", sa.column("name", sa.String), sa.column("live_name", sa.String),
                         sa.column("state", sa.String))  # fmt: skip
    op.execute(workloads.update().where(workloads.c.state.not_in(_TERMINAL)).values(live_name=workloads.c.name))
    with op.batch_alter_table("workloads") as batch:
        batch.drop_constraint("uq_workload_project_name", type_="unique")
        batch.create_unique_constraint("uq_workload_live_name", ["project_id", "live_name"])
        batch.create_index("ix_workloads_project_name", ["project_id", "name"])
        batch.create_index("ix_workloads_retry_at", ["retry_at"])


def downgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.drop_index("ix_workloads_retry_at")
        batch.drop_index("ix_workloads_project_name")
        batch.drop_constraint("uq_workload_live_name", type_="unique")
        batch.create_unique_constraint("uq_workload_project_name", ["project_id", "name"])
        for column in ("deleted_at", "attempts", "retry_at", "retry", "spec_hash", "spec", "live_name"):
            batch.drop_column(column)
