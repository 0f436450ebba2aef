"""lifecycle codes: events and a workload's current reason are stored as a code and arguments, not sentences

Revision ID: 0007
Revises: 0006
"""

import json
import re

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# Stops written as sentences before this revision, recognised once here so the eviction counters keep history.
_SCHEDULER_STOP = re.compile(r"^(reclaim|preempt|consolidate|gang-broken): (.*); stopping$", re.S)
_POLICY_STOP = (
    ("idle", re.compile(r"^(idle for .*); stopping$", re.S)),
    ("max-runtime", re.compile(r"^(ran for .*); stopping$", re.S)),
)


def _event_code(text: str) -> tuple[str, str | None, dict[str, str]]:
    m = _SCHEDULER_STOP.match(text)
    if m:
        return "stop-requested", m.group(1), {"detail": m.group(2)}
    for reason, pattern in _POLICY_STOP:
        m = pattern.match(text)
        if m:
            return "stop-requested", reason, {"text": m.group(1)}
    return "note", None, {"text": text}


def upgrade() -> None:
    with op.batch_alter_table("events") as b:
        b.add_column(sa.Column("code", sa.String(length=32), nullable=True))
        b.add_column(sa.Column("reason_code", sa.String(length=32), nullable=True))
        b.add_column(sa.Column("args", sa.JSON(), nullable=True))
    with op.batch_alter_table("workloads") as b:
        b.add_column(sa.Column("reason_event", sa.String(length=32), nullable=False, server_default="queued"))
        b.add_column(sa.Column("reason_args", sa.JSON(), nullable=True))
    conn = op.get_bind()
    events = sa.table(
        "events", sa.column("id", sa.Integer), sa.column("reason", sa.Text), sa.column("code", sa.String),
        sa.column("reason_code", sa.String), sa.column("args", sa.JSON),
    )  # fmt: skip
    for row in conn.execute(sa.select(events.c.id, events.c.reason)).fetchall():
        code, reason, args = _event_code(row.reason or "")
        conn.execute(events.update().where(events.c.id == row.id).values(code=code, reason_code=reason, args=args))
    workloads = sa.table(
        "workloads", sa.column("id", sa.Integer), sa.column("reason", sa.Text), sa.column("reason_event", sa.String),
        sa.column("reason_args", sa.JSON),
    )  # fmt: skip
    for row in conn.execute(sa.select(workloads.c.id, workloads.c.reason)).fetchall():
        values = {"reason_event": "note", "reason_args": {"text": row.reason or ""}}
        conn.execute(workloads.update().where(workloads.c.id == row.id).values(**values))
    with op.batch_alter_table("events") as b:
        b.alter_column("code", existing_type=sa.String(length=32), nullable=False)
        b.alter_column("args", existing_type=sa.JSON(), nullable=False)
        b.drop_column("reason")
        b.create_index("ix_events_code", ["code"])
    with op.batch_alter_table("workloads") as b:
        b.alter_column("reason_args", existing_type=sa.JSON(), nullable=False)
        b.drop_column("reason")


def downgrade() -> None:
    with op.batch_alter_table("workloads") as b:
        b.add_column(sa.Column("reason", sa.Text(), nullable=False, server_default=""))
    with op.batch_alter_table("events") as b:
        b.add_column(sa.Column("reason", sa.Text(), nullable=False, server_default=""))
    conn = op.get_bind()
    for table, args in (("events", "args"), ("workloads", "reason_args")):
        t = sa.table(table, sa.column("id", sa.Integer), sa.column("reason", sa.Text), sa.column(args, sa.JSON))
        for row in conn.execute(sa.select(t.c.id, t.c[args])).fetchall():
            value = row[1] if isinstance(row[1], dict) else json.loads(row[1] or "{}")
            conn.execute(t.update().where(t.c.id == row.id).values(reason=str(value.get("text", ""))))
    with op.batch_alter_table("events") as b:
        b.drop_index("ix_events_code")
        b.drop_column("code")
        b.drop_column("reason_code")
        b.drop_column("args")
    with op.batch_alter_table("workloads") as b:
        b.drop_column("reason_event")
        b.drop_column("reason_args")
