"""A project's secrets: set by its members, given to every workload of the project as environment variables, and
never shown back (listing gives names and who set them when)."""

from __future__ import annotations

import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.models.access import SecretPublic
from gpupool.services import audit
from gpupool.services.auth import Principal
from gpupool.services.errors import Forbidden, Invalid, NotFound
from gpupool.services.org import visible_queue
from gpupool.services.requests import ENV_KEY, env_denied
from gpupool.store.tables import QueueRow, SecretRow

MAX_VALUE = 32_768
MAX_PER_PROJECT = 100


def _writable(session: Session, who: Principal, project: str) -> QueueRow:
    queue = visible_queue(session, who, project, "project")
    audit.note(tenant=project)
    if not who.can_write(queue.id):
        raise Forbidden(f"your role ({who.role}) cannot manage the secrets of {project!r}")
    return queue


def set_secret(session: Session, who: Principal, project: str, name: str, value: str) -> SecretPublic:
    queue = _writable(session, who, project)
    audit.note(obj=f"secret/{name}")
    if not ENV_KEY.fullmatch(name) or env_denied(name):
        raise Invalid(f"{name[:80]!r} cannot be a secret's name: it must be a usable environment variable name "
                      "that gpupool does not set itself")  # fmt: skip
    if "\x00" in value or len(value) > MAX_VALUE:
        raise Invalid(f"a secret's value has no NUL byte and at most {MAX_VALUE} characters")
    row = session.get(SecretRow, (queue.id, name))
    count = len(session.scalars(select(SecretRow.name).where(SecretRow.project_id == queue.id)).all())
    if row is None and count >= MAX_PER_PROJECT:
        raise Invalid(f"{project!r} has {MAX_PER_PROJECT} secrets already")
    now = time.time()
    if row is None:
        row = SecretRow(project_id=queue.id, name=name, value=value, updated_at=now, updated_by=who.name)
        session.add(row)
    else:
        row.value, row.updated_at, row.updated_by = value, now, who.name
    session.commit()
    return SecretPublic(name=name, project=project, updated_at=now, updated_by=who.name)


def list_secrets(session: Session, who: Principal, project: str) -> list[SecretPublic]:
    queue = _writable(session, who, project)
    rows = session.scalars(select(SecretRow).where(SecretRow.project_id == queue.id).order_by(SecretRow.name))
    return [SecretPublic(name=r.name, project=project, updated_at=r.updated_at, updated_by=r.updated_by) for r in rows]


def delete_secret(session: Session, who: Principal, project: str, name: str) -> None:
    queue = _writable(session, who, project)
    audit.note(obj=f"secret/{name}")
    row = session.get(SecretRow, (queue.id, name))
    if row is None:
        raise NotFound(f"{project!r} has no secret named {name!r}")
    session.delete(row)
    session.commit()
