"""Departments, projects, quotas and users."""

from __future__ import annotations

import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.core import MILLI
from gpupool.core.quota import gpu_count
from gpupool.models.accounts import UserCreate, UserCreated, UserPublic, UserState
from gpupool.models.schemas import DepartmentCreate, ProjectCreate, QueuePublic, QuotaIn, QuotaPublic, QuotaUpdate
from gpupool.services import audit
from gpupool.services.auth import Principal, hash_token, new_token
from gpupool.services.errors import Conflict, Forbidden, Invalid, NotFound
from gpupool.store.holdings import by_project, holdings
from gpupool.store.tables import MembershipRow, QueueRow, QuotaRow, TokenRow, UserRow

INITIAL_TOKEN_DAYS = 90


def _milli(gpus: float | None) -> int | None:
    return None if gpus is None else round(gpus * MILLI)


def queue_named(session: Session, name: str, kind: str | None = None) -> QueueRow:
    row = session.scalar(select(QueueRow).where(QueueRow.name == name))
    if row is None or (kind is not None and row.kind != kind):
        raise NotFound(f"no {kind or 'department or project'} named {name!r}")
    return row


def _check_sums(session: Session, parent: QueueRow | None) -> None:
    """The sum of the children's deserved may not exceed the parent's, in any pool."""
    if parent is None:
        return
    children = session.scalars(select(QueueRow).where(QueueRow.parent_id == parent.id)).all()
    own = {q.pool: q.deserved_milli for q in parent.quotas}
    total: dict[str, int] = {}
    for child in children:
        for q in child.quotas:
            total[q.pool] = total.get(q.pool, 0) + q.deserved_milli
    for pool, want in sorted(total.items()):
        have = own.get(pool, 0)
        if want > have:
            raise Invalid(
                f"the children of {parent.name!r} would deserve {gpu_count(want)} in pool {pool!r}, "
                f"more than its own {have / MILLI:g}"
            )


def _quota_row(q: QuotaIn) -> QuotaRow:
    deserved, limit = _milli(q.deserved_gpus) or 0, _milli(q.limit_gpus)
    if limit is not None and limit < deserved:
        raise Invalid(f"limit ({gpu_count(limit)}) is below deserved ({gpu_count(deserved)})")
    return QuotaRow(pool=q.pool, deserved_milli=deserved, limit_milli=limit, weight=q.weight)


def _create(session: Session, who: Principal, body: QuotaIn, name: str, kind: str, parent: QueueRow | None) -> QueueRow:
    audit.note(tenant=parent.name if parent else name, obj=f"{kind}/{name}")
    if kind == "department" or parent is None:
        who.require_admin()
    elif not who.manages_department(parent.id):
        raise Forbidden(f"only an admin or an admin of {parent.name!r} may create projects in it")
    if session.scalar(select(QueueRow.id).where(QueueRow.name == name)) is not None:
        raise Conflict(f"a department or project named {name!r} already exists")
    row = QueueRow(name=name, kind=kind, parent_id=parent.id if parent else None, created_at=time.time())
    row.strict_fifo = bool(getattr(body, "strict_fifo", False))
    row.quotas.append(_quota_row(body))
    session.add(row)
    session.flush()
    _check_sums(session, parent)
    return row


def create_department(session: Session, who: Principal, body: DepartmentCreate) -> QueuePublic:
    row = _create(session, who, body, body.name, "department", None)
    session.commit()
    return queue_public(session, row)


def create_project(session: Session, who: Principal, body: ProjectCreate) -> QueuePublic:
    parent = visible_queue(session, who, body.department, "department") if body.department else None
    row = _create(session, who, body, body.name, "project", parent)
    session.commit()
    return queue_public(session, row)


def update_quota(session: Session, who: Principal, name: str, body: QuotaUpdate) -> QueuePublic:
    """Admins set any quota; a department admin its projects', within the department's own (which only an admin
    sets): the sum of the children's deserved never exceeds the parent's."""
    row = visible_queue(session, who, name)
    audit.note(tenant=name, obj=f"quota/{name}")
    if not (who.is_admin or (row.kind == "project" and who.manages_project(row.id))):
        raise Forbidden(f"your role ({who.role}) cannot change the quota of {name!r}")
    quota = next((q for q in row.quotas if q.pool == body.pool), None)
    if quota is None:
        quota = QuotaRow(pool=body.pool, deserved_milli=0, limit_milli=None, weight=1)
        row.quotas.append(quota)
    if body.deserved_gpus is not None:
        quota.deserved_milli = _milli(body.deserved_gpus) or 0
    if body.clear_limit:
        quota.limit_milli = None
    elif body.limit_gpus is not None:
        quota.limit_milli = _milli(body.limit_gpus)
    if body.weight is not None:
        quota.weight = body.weight
    if quota.limit_milli is not None and quota.limit_milli < quota.deserved_milli:
        session.rollback()
        raise Invalid("limit is below deserved")
    session.flush()
    try:
        _check_sums(session, session.get(QueueRow, row.parent_id) if row.parent_id else None)
        _check_sums(session, row)
    except Invalid:
        session.rollback()
        raise
    session.commit()
    return queue_public(session, row)


def queue_public(session: Session, row: QueueRow, allocated: dict[int, int] | None = None) -> QueuePublic:
    parent = session.get(QueueRow, row.parent_id) if row.parent_id else None
    return QueuePublic(
        name=row.name,
        kind="project" if row.kind == "project" else "department",
        parent=parent.name if parent else None,
        strict_fifo=row.strict_fifo,
        production_allowed=row.production_allowed,
        pod_security=row.pod_security,
        host_network=row.host_network,
        mlflow_uri=row.mlflow_uri,
        quotas=[
            QuotaPublic(
                pool=q.pool,
                deserved_gpus=q.deserved_milli / MILLI,
                limit_gpus=None if q.limit_milli is None else q.limit_milli / MILLI,
                weight=q.weight,
            )
            for q in sorted(row.quotas, key=lambda q: q.pool)
        ],
        allocated_gpus=(allocated or {}).get(row.id, 0) / MILLI,
    )


def list_queues(session: Session, who: Principal, kind: str) -> list[QueuePublic]:
    rows = session.scalars(select(QueueRow).where(QueueRow.kind == kind).order_by(QueueRow.name)).all()
    allocated = by_project(holdings(session))
    if kind == "department":
        by_parent: dict[int, int] = {}
        for r in session.scalars(select(QueueRow).where(QueueRow.kind == "project")):
            if r.parent_id is not None:
                by_parent[r.parent_id] = by_parent.get(r.parent_id, 0) + allocated.get(r.id, 0)
        allocated = by_parent
    parents = {q.id: q.parent_id for q in session.scalars(select(QueueRow))}
    visible = [r for r in rows if can_see(who, r, parents)]
    return [queue_public(session, r, allocated) for r in visible]


def can_see(who: Principal, row: QueueRow, parents: dict[int, int | None]) -> bool:
    if row.kind == "project":
        return who.can_read(row.id)
    return who.is_admin or who.sees_department(row.id, parents)


def visible_queue(session: Session, who: Principal, name: str, kind: str | None = None) -> QueueRow:
    """A department or project the caller may see; others are not found (404, never 403)."""
    row = session.scalar(select(QueueRow).where(QueueRow.name == name))
    parents = {q.id: q.parent_id for q in session.scalars(select(QueueRow))}
    if row is None or (kind is not None and row.kind != kind) or not can_see(who, row, parents):
        raise NotFound(f"no {kind or 'department or project'} named {name!r}")
    return row


def create_user(session: Session, who: Principal, body: UserCreate) -> UserCreated:
    """Admins create anyone; a department admin creates members and viewers of its own projects."""
    audit.note(tenant=body.projects[0] if len(body.projects) == 1 else None, obj=f"user/{body.name}")
    projects = [visible_queue(session, who, n, "project") for n in sorted(set(body.projects))]
    if not who.is_admin:
        if body.role == "admin" or not who.departments:
            raise Forbidden("only an admin may create admins" if body.role == "admin" else "only admins may do this")
        if not projects or not all(who.manages_project(p.id) for p in projects):
            raise Forbidden("a department admin creates users in its own projects only: name them")
    taken = session.scalar(select(UserRow).where(UserRow.name == body.name))
    if taken is not None and taken.deleted_at is not None:
        raise Conflict(f"{body.name!r} was a user, deleted: its workloads and reports keep the name; choose another")
    if taken is not None:
        raise Conflict(f"a user named {body.name!r} already exists")
    now = time.time()
    user = UserRow(name=body.name, role=body.role, kind="person", created_at=now)
    session.add(user)
    session.flush()
    role = "viewer" if body.role == "viewer" else "member"
    session.add_all(MembershipRow(user_id=user.id, project_id=p.id, role=role) for p in projects)
    token = new_token()
    session.add(TokenRow(user_id=user.id, kind="personal", name="initial", token_hash=hash_token(token),
                         created_by=who.id, created_at=now, expires_at=now + INITIAL_TOKEN_DAYS * 86400))  # fmt: skip
    session.commit()
    return UserCreated(name=user.name, role=body.role, projects=sorted(set(body.projects)), token=token)


def state_of(user: UserRow) -> UserState:
    return "deleted" if user.deleted_at is not None else "disabled" if user.disabled_at is not None else "active"


def list_users(session: Session, who: Principal, include_deleted: bool = False) -> list[UserPublic]:
    """Admins see everyone; a department admin the people of its projects. Deleted users only when asked for
    (and by admins: a deleted user belongs to no project)."""
    if not who.is_admin and not who.departments:
        raise Forbidden("only admins and department admins may list users")
    names = {q.id: q.name for q in session.scalars(select(QueueRow))}
    members: dict[int, list[str]] = {}
    for m in session.scalars(select(MembershipRow).order_by(MembershipRow.project_id)):
        if who.is_admin or who.manages_project(m.project_id) or m.project_id in who.departments:
            members.setdefault(m.user_id, []).append(names[m.project_id])
    return [
        UserPublic(name=u.name, role=u.role, projects=sorted(members.get(u.id, [])), state=state_of(u))
        for u in session.scalars(select(UserRow).order_by(UserRow.name))
        if (who.is_admin or u.id in members) and (include_deleted or u.deleted_at is None)
    ]
