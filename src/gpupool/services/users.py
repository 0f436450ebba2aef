"""Offboarding: a user disabled (nothing it holds signs in, until enabled again), deleted (disabled for good, out of
every project and of the user list, its name kept by its history), or taken out of one project; and the work of
theirs that goes with it, cancelled unless the admin keeps it running.

Each is one write: the user's row taken for update, the change, and the cancel of every live workload of theirs
that the store then holds, committed together. A submit re-checks its submitter inside its own write, waiting on
that row (workloads._still_allowed), so no workload slips in between the change and the cancel."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from gpupool.lifecycle import transitions as lifecycle
from gpupool.lifecycle.phases import TERMINAL, Offboarding
from gpupool.models.access import TokenPublic
from gpupool.models.accounts import Offboarded
from gpupool.services import apps, audit, tokens
from gpupool.services.auth import Principal
from gpupool.services.errors import Conflict, Invalid, NotFound
from gpupool.services.org import state_of
from gpupool.store import changes
from gpupool.store.tables import MembershipRow, QueueRow, TokenRow, UserRow, WorkloadRow

TRIES = 5


def person(session: Session, name: str) -> UserRow:
    """A user that is not deleted, by name; a deleted one is not found."""
    user = session.scalar(select(UserRow).where(UserRow.name == name, UserRow.deleted_at.is_(None)))
    if user is None:
        raise NotFound(f"no user named {name!r}")
    return user


def _offboardable(session: Session, who: Principal, name: str, what: str) -> UserRow:
    who.require_admin()
    user = person(session, name)
    audit.note(tenant=None, obj=f"user/{name}")
    if user.kind == "service":
        raise Invalid(f"{name!r} is a project's service account: revoke its tokens (gpupool token revoke)")
    if user.id == who.id and what != "enable":
        raise Invalid(f"you cannot {what} yourself: another admin can")
    return user


def offboard(
    session: Session,
    who: Principal,
    user_id: int,
    change: Callable[[UserRow], None],
    why: Offboarding | None,
    projects: Iterable[int] | None = None,
) -> list[str]:
    """Takes the user's row for update, applies `change` to it (and whatever else it writes), and cancels the
    user's live workloads (in `projects` only, where given; none when `why` is None), saying why, each a cancel by
    `who`; commits it all at once, or reads and decides again when a scheduling cycle wrote one of those
    workloads meanwhile. The names cancelled, as project/name, sorted."""
    names = {q.id: q.name for q in session.scalars(select(QueueRow))}
    for _ in range(TRIES):
        user = session.scalar(select(UserRow).where(UserRow.id == user_id).with_for_update())
        assert user is not None
        change(user)
        session.flush()  # the user's row is written (SQLite: the write lock taken) before its work is read
        rows: list[WorkloadRow] = []
        if why is not None:
            query = select(WorkloadRow).where(WorkloadRow.owner_id == user.id,
                                              WorkloadRow.state.not_in(sorted(TERMINAL)))  # fmt: skip
            if projects is not None:
                query = query.where(WorkloadRow.project_id.in_(sorted(projects)))
            rows = list(session.scalars(query.order_by(WorkloadRow.id)))
        now = time.time()
        with session.no_autoflush:
            read = {r.id: r.version for r in rows}
            for row in rows:
                event = lifecycle.cancel(row, who.name, now, offboarded=why.value if why else None, owner=user.name,
                                         project=names.get(row.project_id, "?"))  # fmt: skip
                if event is not None:
                    session.add(event)
            if rows and changes.claim(session, read) != set(read):
                session.rollback()  # a cycle wrote one of them meanwhile: read them again and decide again
                continue
        session.commit()
        return sorted(f"{names.get(r.project_id, '?')}/{r.name}" for r in rows)
    raise Conflict(f"the work of user {user_id} kept changing while it was stopped; try again")


def service_tokens_made_by(session: Session, user: UserRow) -> list[TokenPublic]:
    """The live service tokens the user made: they are their projects' (its automation's), so offboarding the
    person leaves them working, and says so, with what revokes each. (API keys die with their maker's rights.)"""
    now = time.time()
    query = select(TokenRow).where(TokenRow.created_by == user.id, TokenRow.user_id != user.id,
                                   TokenRow.kind == "service", TokenRow.revoked_at.is_(None))  # fmt: skip
    return [
        tokens.public(session, t)
        for t in session.scalars(query.order_by(TokenRow.id))
        if t.expires_at is None or t.expires_at > now
    ]


def disable(session: Session, who: Principal, name: str, keep_work: bool) -> Offboarded:
    """Nothing of the user's signs in from now: its tokens and sessions are refused (not revoked: enabling it
    again gives them back), its apps' sessions end; its live work is cancelled unless `keep_work`."""
    user = _offboardable(session, who, name, "disable")

    def change(u: UserRow) -> None:
        u.disabled_at = u.disabled_at or time.time()
        apps.end_app_sessions(session, u.id)

    stopped = offboard(session, who, user.id, change, None if keep_work else Offboarding.DISABLED)
    return Offboarded(user=user.name, state="disabled", stopped=stopped,
                      service_tokens=service_tokens_made_by(session, user))  # fmt: skip


def enable(session: Session, who: Principal, name: str) -> Offboarded:
    user = _offboardable(session, who, name, "enable")
    user.disabled_at = None
    session.commit()
    return Offboarded(user=user.name, state="active", stopped=[])


def delete_user(session: Session, who: Principal, name: str, keep_work: bool) -> Offboarded:
    """Disabled for good: its tokens revoked, its memberships gone, out of the user list. Its workloads, usage and
    audit trail keep naming it, so its name is not given to anyone else."""
    user = _offboardable(session, who, name, "delete")

    def change(u: UserRow) -> None:
        now = time.time()
        u.disabled_at = u.disabled_at or now
        u.deleted_at = now
        apps.end_app_sessions(session, u.id)
        session.execute(update(TokenRow).where(TokenRow.user_id == u.id, TokenRow.revoked_at.is_(None))
                        .values(revoked_at=now))  # fmt: skip
        session.execute(delete(MembershipRow).where(MembershipRow.user_id == u.id))

    stopped = offboard(session, who, user.id, change, None if keep_work else Offboarding.DELETED)
    return Offboarded(user=user.name, state="deleted", stopped=stopped,
                      service_tokens=service_tokens_made_by(session, user))  # fmt: skip


__all__ = ["delete_user", "disable", "enable", "offboard", "person", "service_tokens_made_by", "state_of"]
