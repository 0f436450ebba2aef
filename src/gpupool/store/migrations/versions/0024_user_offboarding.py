"""a user can be disabled (nothing it holds signs in) and deleted (out of its projects and the user list)

Revision ID: 0024
Revises: 0023
"""

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("users", sa.Column("disabled_at", sa.Float(), nullable=True))
    op.add_column("users", sa.Column("deleted_at", sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column("users", "deleted_at")
    op.drop_column("users", "disabled_at")
