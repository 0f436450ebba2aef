"""server state: the session secret and the first start's bootstrap live in the store, not the data dir

Revision ID: 0006
Revises: 0005
"""

import json
import time

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "server_state",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    # A store that has users was bootstrapped before the state moved here: it never bootstraps again.
    conn = op.get_bind()
    if conn.execute(sa.text("SELECT id FROM users LIMIT 1")).first() is not None:
        conn.execute(
            sa.text("INSERT INTO server_state (name, value, updated_at) VALUES ('bootstrap', :v, :t)"),
            {"v": json.dumps({"state": "done"}), "t": time.time()},
        )


def downgrade() -> None:
    op.drop_table("server_state")
