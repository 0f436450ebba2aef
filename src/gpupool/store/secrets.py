"""A project's secrets as its workloads get them."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.store.tables import SecretRow


def project_environment(session: Session, project_id: int) -> dict[str, str]:
    """Every secret of the project, by name: the environment variables its workloads start with."""
    rows = session.scalars(select(SecretRow).where(SecretRow.project_id == project_id).order_by(SecretRow.name))
    return {r.name: r.value for r in rows}
