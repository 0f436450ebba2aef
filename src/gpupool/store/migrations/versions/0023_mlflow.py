"""a project's MLflow tracking server, and each workload's server and run

Revision ID: 0023
Revises: 0022
"""

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("queues", sa.Column("mlflow_uri", sa.String(512), nullable=True))
    op.add_column("workloads", sa.Column("mlflow", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("workloads", "mlflow")
    op.drop_column("queues", "mlflow_uri")
