"""Offboarding: a user disabled (nothing it holds signs in, until enabled again), deleted (disabled for good, out of
every project and of the user list, its name kept by its history), or taken out of one project; and the work of
theirs that goes with it, cancelled unless the admin keeps it running."""

from __future__ import annotations

import time
from collections.abc import Iterable

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from gpupool.lifecycle import transitions as lifecycle
from gpupool.lifecycle.phases import TERMINAL, Offboarding
from gpupool.models.accounts import Offboarded
from gpupool.services import apps, audit
from gpupool.services.auth import Principal
from gpupool.services.errors import Conflict, Invalid, NotFound
from gpupool.store import changes
from gpupool.store.tables import MembershipRow, QueueRow, TokenRow, UserRow, WorkloadRow

TRIES = 5


def _user(session: Session, who: Principal, name: str) -> UserRow:
    who.require_admin()
    user = session.scalar(select(UserRow).where(UserRow.name == name, UserRow.deleted_at.is_(None)))
    if user is None:
        raise NotFound(f"no user named {name!r}")
    audit.note(tenant=None, obj=f"user/{name}")
    return user


def _not_self(who: Principal, user: UserRow, what: str) -> None:
    if user.id == who.id:
        raise Invalid(f"you cannot {what} yourself: another admin can")


def stop_work(
    session: Session, who: Principal, user: UserRow, why: Offboarding, projects: Iterable[int] | None = None
) -> list[str]:
    """Cancels the user's live workloads (in `projects` only, where given), each as one claimed write, as a cancel
    by `who` is, saying why; the names cancelled, as "project/name", sorted. Committed."""
    names = {q.id: q.name for q in session.scalars(select(QueueRow))}
    query = select(WorkloadRow).where(WorkloadRow.owner_id == user.id, WorkloadRow.state.not_in(sorted(TERMINAL)))
    if projects is not None:
        query = query.where(WorkloadRow.project_id.in_(sorted(projects)))
    stopped: list[str] = []
    for _ in range(TRIES):
        rows = [r for r in session.scalars(query.order_by(WorkloadRow.id)) if r.state not in TERMINAL]
        if not rows:
            break
        now = time.time()
        with session.no_autoflush:
            read = {r.id: r.version for r in rows}
            for row in rows:
                event = lifecycle.cancel(row, who.name, now, offboarded=why.value, owner=user.name,
                                         project=names.get(row.project_id, "?"))  # fmt: skip
                if event is not None:
                    session.add(event)
            claimed = changes.claim(session, read)
        if claimed != set(read):
            session.rollback()  # a cycle wrote one of them meanwhile: read them again and cancel again
            continue
        session.commit()
        stopped += [f"{names.get(r.project_id, '?')}/{r.name}" for r in rows]
        break
    else:
        raise Conflict(f"the work of {user.name!r} kept changing while it was stopped; try again")
    return sorted(stopped)


def disable(session: Session, who: Principal, name: str, keep_work: bool) -> Offboarded:
    """Nothing of the user's signs in from now: its tokens and sessions are refused (not revoked: enabling it
    again gives them back), its apps' sessions end; its live work is cancelled unless `keep_work`."""
    user = _user(session, who, name)
    _not_self(who, user, "disable")
    if user.disabled_at is None:
        user.disabled_at = time.time()
    apps.end_app_sessions(session, user.id)
    session.commit()
    stopped = [] if keep_work else stop_work(session, who, user, Offboarding.DISABLED)
    return Offboarded(user=user.name, state="disabled", stopped=stopped)


def enable(session: Session, who: Principal, name: str) -> Offboarded:
    user = _user(session, who, name)
    user.disabled_at = None
    session.commit()
    return Offboarded(user=user.name, state="active", stopped=[])


def delete_user(session: Session, who: Principal, name: str, keep_work: bool) -> Offboarded:
    """Disabled for good: its tokens revoked, its memberships gone, out of the user list. Its workloads, usage and
    audit trail keep naming it, so its name is not given to anyone else."""
    user = _user(session, who, name)
    _not_self(who, user, "delete")
    now = time.time()
    user.disabled_at = user.disabled_at or now
    apps.end_app_sessions(session, user.id)
    session.commit()
    stopped = [] if keep_work else stop_work(session, who, user, Offboarding.DELETED)
    session.execute(update(TokenRow).where(TokenRow.user_id == user.id, TokenRow.revoked_at.is_(None))
                    .values(revoked_at=now))  # fmt: skip
    session.execute(delete(MembershipRow).where(MembershipRow.user_id == user.id))
    user.deleted_at = now
    session.commit()
    return Offboarded(user=user.name, state="deleted", stopped=stopped)
