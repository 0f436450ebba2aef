"""tenancy: roles per membership, tokens and sessions in one table, project secrets, an audit trail, identities
from a provider

Revision ID: 0005
Revises: 0004
"""

import time

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=True),
        sa.Column("role", sa.String(length=16), nullable=True),
        sa.Column("app", sa.String(length=63), nullable=True),
        sa.Column("created_by", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=True),
        sa.Column("revoked_at", sa.Float(), nullable=True),
        sa.Column("last_used_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"]),
        sa.ForeignKeyConstraint(["project_id"], ["queues.id"]),
        sa.ForeignKeyConstraint(["created_by"], ["users.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_hash"),
    )
    op.create_index("ix_tokens_user_id", "tokens", ["user_id"])
    # Every user's one token so far becomes a personal token of theirs; the column goes.
    conn = op.get_bind()
    now = time.time()
    for user_id, token_hash in conn.execute(sa.text("SELECT id, token_hash FROM users")).all():
        conn.execute(
            sa.text(
                "INSERT INTO tokens (user_id, kind, name, token_hash, created_at) "
                "VALUES (:u, 'personal', 'initial', :h, :t)"
            ),
            {"u": user_id, "h": token_hash, "t": now},
        )
    with op.batch_alter_table("users") as b:
        b.drop_column("token_hash")
        b.add_column(sa.Column("kind", sa.String(length=16), nullable=False, server_default="person"))
        b.add_column(sa.Column("issuer", sa.String(length=255), nullable=True))
        b.add_column(sa.Column("subject", sa.String(length=255), nullable=True))
        b.add_column(sa.Column("email", sa.String(length=255), nullable=True))
        b.create_unique_constraint("uq_user_identity", ["issuer", "subject"])
    with op.batch_alter_table("memberships") as b:
        b.add_column(sa.Column("role", sa.String(length=16), nullable=False, server_default="member"))
    conn.execute(
        sa.text("UPDATE memberships SET role = 'viewer' WHERE user_id IN (SELECT id FROM users WHERE role = 'viewer')")
    )
    with op.batch_alter_table("queues") as b:
        b.add_column(sa.Column("production_allowed", sa.Boolean(), nullable=False, server_default=sa.false()))
        b.add_column(sa.Column("pod_security", sa.String(length=16), nullable=False, server_default="restricted"))
    op.create_table(
        "secrets",
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("updated_by", sa.String(length=63), nullable=False),
        sa.ForeignKeyConstraint(["project_id"], ["queues.id"]),
        sa.PrimaryKeyConstraint("project_id", "name"),
    )
    op.create_table(
        "audit",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("request_id", sa.String(length=36), nullable=False),
        sa.Column("actor", sa.String(length=63), nullable=True),
        sa.Column("role", sa.String(length=16), nullable=True),
        sa.Column("tenant", sa.String(length=63), nullable=True),
        sa.Column("department", sa.String(length=63), nullable=True),
        sa.Column("obj", sa.String(length=255), nullable=False),
        sa.Column("action", sa.String(length=96), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("address", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_audit_at", "audit", ["at"])
    op.create_index("ix_audit_tenant", "audit", ["tenant"])
    op.create_index("ix_audit_department", "audit", ["department"])


def downgrade() -> None:
    raise NotImplementedError("0005 moves tokens out of users; restore from a backup to go back")
