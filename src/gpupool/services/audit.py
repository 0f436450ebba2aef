"""The audit trail: every mutating request and every sign-in, with who, in what role, on which tenant's object,
what was done and how it ended. The API's middleware writes one record per request; use cases say which tenant
and object the request touched, through `note`."""

from __future__ import annotations

import contextvars
import time
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.models.access import AuditPublic
from gpupool.services.auth import Principal
from gpupool.services.errors import Forbidden
from gpupool.store.tables import AuditRow, QueueRow

MAX_TEXT = 63
"""User-controlled text (a name tried at sign-in, say) is cut: a log must not be a way to fill the disk."""


@dataclass
class Note:
    """What a use case learned about the request it served; the middleware reads it when the response is out."""

    tenant: str | None = None
    obj: str | None = None
    actor: str | None = None
    extra: dict[str, str] = field(default_factory=dict)


_current: contextvars.ContextVar[Note | None] = contextvars.ContextVar("gpupool_audit_note", default=None)


def begin() -> Note:
    """A fresh note for this request. Worker threads run with a copy of the context, which holds this same
    object, so what a use case notes there is seen here."""
    note = Note()
    _current.set(note)
    return note


def note(tenant: str | None = None, obj: str | None = None, actor: str | None = None) -> None:
    current = _current.get()
    if current is None:
        return
    if tenant is not None:
        current.tenant = tenant[:MAX_TEXT]
    if obj is not None:
        current.obj = obj[:255]
    if actor is not None:
        current.actor = actor[:MAX_TEXT]


@dataclass(frozen=True, slots=True)
class Entry:
    request_id: str
    action: str
    obj: str
    status: int
    address: str | None
    who: Principal | None
    note: Note


def record(session: Session, entry: Entry, now: float | None = None) -> None:
    department = None
    if entry.note.tenant is not None:
        queue = session.scalar(select(QueueRow).where(QueueRow.name == entry.note.tenant))
        if queue is not None and queue.kind == "department":
            department = queue.name
        elif queue is not None and queue.parent_id is not None:
            parent = session.get(QueueRow, queue.parent_id)
            department = parent.name if parent else None
    who = entry.who
    session.add(
        AuditRow(
            at=time.time() if now is None else now, request_id=entry.request_id[:36],
            actor=who.name if who else entry.note.actor, role=who.role if who else None, tenant=entry.note.tenant,
            department=department, obj=(entry.note.obj or entry.obj)[:255], action=entry.action[:96],
            status=entry.status, address=(entry.address or "")[:64] or None,
        )
    )  # fmt: skip
    session.commit()


def list_records(
    session: Session, who: Principal, since: float | None, actor: str | None, limit: int
) -> list[AuditPublic]:
    """Admins read everything; a department admin what touched its departments."""
    if not who.is_admin and not who.departments:
        raise Forbidden("only admins and department admins may read the audit trail")
    query = select(AuditRow).order_by(AuditRow.id.desc()).limit(limit)
    if since is not None:
        query = query.where(AuditRow.at >= since)
    if actor is not None:
        query = query.where(AuditRow.actor == actor)
    if not who.is_admin:
        names = [q.name for q in session.scalars(select(QueueRow).where(QueueRow.id.in_(sorted(who.departments))))]
        query = query.where(AuditRow.department.in_(names))
    return [
        AuditPublic(
            id=r.id,
            at=r.at,
            request_id=r.request_id,
            actor=r.actor,
            role=r.role,
            tenant=r.tenant,
            department=r.department,
            object=r.obj,
            action=r.action,
            status=r.status,
            address=r.address,
        )
        for r in session.scalars(query)
    ]
