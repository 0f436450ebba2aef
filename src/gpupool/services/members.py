"""Who belongs to which project or department, with which role; and a project's settings."""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from gpupool.lifecycle.phases import Offboarding
from gpupool.models.access import MemberPublic, ProjectSettings
from gpupool.models.accounts import Offboarded
from gpupool.models.schemas import QueuePublic
from gpupool.services import users
from gpupool.services.auth import Principal
from gpupool.services.errors import Forbidden, Invalid, NotFound
from gpupool.services.org import queue_public, state_of, visible_queue
from gpupool.store.tables import MembershipRow, QueueRow, UserRow


def _may_manage(who: Principal, queue: QueueRow, role: str) -> None:
    """Admins grant anything. A department admin grants member and viewer in its projects, and nothing on a
    department (so never 'admin'): it cannot reach beyond its department or raise anyone above itself."""
    if who.is_admin:
        return
    if queue.kind == "project" and who.manages_project(queue.id) and role in ("member", "viewer"):
        return
    raise Forbidden(f"your role ({who.role}) cannot grant {role!r} on {queue.name!r}")


def set_member(session: Session, who: Principal, queue_name: str, user_name: str, role: str) -> MemberPublic:
    queue = visible_queue(session, who, queue_name)
    if (queue.kind == "department") != (role == "admin"):
        raise Invalid("a department has admins; a project has members and viewers")
    _may_manage(who, queue, role)
    user = users.person(session, user_name)
    if user.kind == "service":
        raise Invalid(f"{user_name!r} is a service account; its tokens say what it may do")
    row = session.get(MembershipRow, (user.id, queue.id))
    if row is None:
        session.add(MembershipRow(user_id=user.id, project_id=queue.id, role=role))
    else:
        row.role = role
    session.commit()
    return MemberPublic(user=user.name, queue=queue.name, role=role)


def remove_member(
    session: Session, who: Principal, queue_name: str, user_name: str, keep_work: bool = False
) -> Offboarded:
    """Out of a project (or a department's admins): their live work in the project is cancelled, saying why,
    unless `keep_work` (it then runs on, still theirs, until it ends)."""
    queue = visible_queue(session, who, queue_name)
    # Who may manage it is asked first: which names exist is not for those who may not (a viewer, a member).
    if not (who.is_admin or (queue.kind == "project" and who.manages_project(queue.id))):
        raise Forbidden(f"your role ({who.role}) cannot take anyone out of {queue.name!r}")
    user = users.person(session, user_name)
    row = session.get(MembershipRow, (user.id, queue.id))
    if row is None:
        raise NotFound(f"{user_name!r} is not in {queue_name!r}")
    _may_manage(who, queue, row.role)

    def change(u: UserRow) -> None:
        session.execute(delete(MembershipRow).where(MembershipRow.user_id == u.id,
                                                    MembershipRow.project_id == queue.id))  # fmt: skip

    why = Offboarding.REMOVED if queue.kind == "project" and not keep_work else None
    stopped = users.offboard(session, who, user.id, change, why, [queue.id])
    return Offboarded(user=user.name, state=state_of(user), stopped=stopped,
                      service_tokens=[t for t in users.service_tokens_made_by(session, user)
                                      if t.project == queue.name])  # fmt: skip


def list_members(session: Session, who: Principal, queue_name: str) -> list[MemberPublic]:
    queue = visible_queue(session, who, queue_name)
    if not (who.is_admin or who.manages_project(queue.id) or who.manages_department(queue.id)):
        raise Forbidden(f"your role ({who.role}) cannot list the members of {queue_name!r}")
    rows = session.execute(
        select(UserRow.name, MembershipRow.role)
        .join(MembershipRow, MembershipRow.user_id == UserRow.id)
        .where(MembershipRow.project_id == queue.id)
        .order_by(UserRow.name)
    ).all()
    return [MemberPublic(user=name, queue=queue.name, role=role) for name, role in rows]


def update_project(session: Session, who: Principal, name: str, body: ProjectSettings) -> QueuePublic:
    """Production priority: admins and the department's admins. Pod security and the host network: admins only."""
    queue = visible_queue(session, who, name, "project")
    if not who.manages_project(queue.id):
        raise Forbidden(f"your role ({who.role}) cannot change the settings of {name!r}")
    if body.pod_security is not None:
        who.require_admin()
        queue.pod_security = body.pod_security
    if body.host_network is not None:
        who.require_admin()
        queue.host_network = body.host_network
    if body.production_allowed is not None:
        queue.production_allowed = body.production_allowed
    if body.mlflow_uri is not None:
        queue.mlflow_uri = body.mlflow_uri.rstrip("/") or None
    session.commit()
    return queue_public(session, queue)
