"""hyperparameter sweeps (their Optuna studies live in Optuna's own tables, beside gpupool's)

Revision ID: 0022
Revises: 0021
"""

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("project_id", sa.Integer(), sa.ForeignKey("queues.id"), nullable=False),
        sa.Column("owner_id", sa.Integer(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("study", sa.String(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.UniqueConstraint("project_id", "name"),
    )
    op.create_index("ix_sweeps_state", "sweeps", ["state"])


def downgrade() -> None:
    op.drop_table("sweeps")
