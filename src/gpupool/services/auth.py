"""Who is calling, and what they may do: credentials (stored as SHA-256: they are 256-bit random, so a slow hash
buys nothing) resolved to a principal with a role per project and per department.

Roles, from most to least: admin (everything); department admin (its departments' projects, their quotas within
the department's budget, policies that only tighten, memberships); project member (submit, cancel, open apps);
viewer (read). A token never has more rights than its user has now, and may have fewer (a project scope, a role
cap): JupyterHub's rule.

Credentials make credentials only from the user's whole identity (`require_own_login`): a narrower one (a
workload's own token, a token narrowed to a project or a role, a service token) never sets a password, opens a
session or makes a token, each of which would outlive it or be wider than it. So nothing a narrow credential
holds was made from it, and revoking it, or ending the workload attempt it belongs to, leaves nothing to revoke
after it (docs/security.md, "Credentials").
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.lifecycle.phases import LIVE
from gpupool.services.errors import Forbidden
from gpupool.store import workload_tokens
from gpupool.store.tables import MembershipRow, QueueRow, TokenRow, UserRow, WorkloadRow

RANK = {"viewer": 1, "member": 2, "admin": 3}
"""Project roles in order; 'admin' on a project is what a department admin has on its department's projects."""
API_KINDS = ("personal", "service", "session")
"""Tokens that call the API (an apikey opens one inference service, nothing else)."""


@dataclass(frozen=True, slots=True)
class Principal:
    id: int
    name: str
    role: str
    """'admin', 'department-admin' (of at least one department), 'member' or 'viewer': for display."""
    projects: Mapping[int, str] = field(default_factory=dict)
    """Project id → its role there: viewer, member, or admin (through a department it administers)."""
    departments: frozenset[int] = frozenset()
    """Departments it administers."""
    token_id: int | None = None
    kind: str = "personal"
    narrowed: bool = False
    """Its token names a project or a role (a workload's and a service token's always do): less than its user."""

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def project_ids(self) -> frozenset[int]:
        return frozenset(self.projects)

    def can_read(self, project_id: int) -> bool:
        return self.is_admin or project_id in self.projects

    def can_write(self, project_id: int) -> bool:
        return self.is_admin or RANK.get(self.projects.get(project_id, ""), 0) >= RANK["member"]

    def manages_project(self, project_id: int) -> bool:
        return self.is_admin or self.projects.get(project_id) == "admin"

    def manages_department(self, department_id: int) -> bool:
        return self.is_admin or department_id in self.departments

    def sees_department(self, department_id: int, children: Mapping[int, int | None]) -> bool:
        """Admins and its admins; members of one of its projects see it as well (its quota frames theirs)."""
        return self.manages_department(department_id) or any(children.get(p) == department_id for p in self.projects)

    def require_admin(self) -> None:
        if not self.is_admin:
            raise Forbidden("only an admin may do this")


def require_own_login(who: Principal, action: str) -> None:
    """Refuse `action` (set passwords, open sessions, make tokens) to anything but the user's whole identity: a
    session (from a password or single sign-on) or a personal token narrowed to nothing. A password or a session
    made by a narrower credential would outlive it with every right of its user (a workload's token, readable by
    its project's members, would become its owner's login), and a token it made could be wider than it."""
    if who.kind == "workload":
        raise Forbidden(f"a workload's own token cannot {action}: it ends with the workload")
    if who.kind == "service":
        raise Forbidden(f"a service token cannot {action}: it belongs to its project, not to a person")
    if who.narrowed:
        raise Forbidden(f"a token narrowed to a project or a role cannot {action}: use your own login")
    if who.kind not in ("personal", "session") or who.token_id is None:
        raise Forbidden(f"only your own login can {action}")


def new_token(prefix: str = "gp_") -> str:
    return prefix + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def principal_for(
    session: Session,
    user: UserRow,
    *,
    scope: int | None = None,
    cap: str | None = None,
    token_id: int | None = None,
    kind: str = "personal",
) -> Principal:
    """The user's rights now, narrowed to `scope` (a project) and `cap` (a role) where a token says so."""
    queues = session.scalars(select(QueueRow)).all()
    parents = {q.id: q.parent_id for q in queues}
    kinds = {q.id: q.kind for q in queues}
    projects: dict[int, str] = {}
    departments: set[int] = set()
    for m in session.scalars(select(MembershipRow).where(MembershipRow.user_id == user.id)):
        if kinds.get(m.project_id) == "department" and m.role == "admin":
            departments.add(m.project_id)
        elif kinds.get(m.project_id) == "project":
            projects[m.project_id] = m.role
    for pid, parent in parents.items():
        if parent in departments and kinds.get(pid) == "project":
            projects[pid] = "admin"
    role = user.role if user.role in ("admin", "viewer") else "member"
    if role != "admin" and departments:
        role = "department-admin"
    if scope is not None:  # a project's token: that project only, never the platform or a department
        if role == "admin":
            projects[scope] = "admin"
        projects = {scope: projects[scope]} if scope in projects else {}
        departments = set()
        role = "viewer" if projects.get(scope) == "viewer" else "member"
    if cap is not None and cap != "admin":
        projects = {p: cap if RANK[r] > RANK[cap] else r for p, r in projects.items()}
        departments = set()
        role = "viewer" if "viewer" in (cap, role) else "member"
    narrowed = scope is not None or cap is not None
    return Principal(user.id, user.name, role, projects, frozenset(departments), token_id, kind, narrowed)


def authenticate(session: Session, token: str, now: float | None = None) -> Principal | None:
    """The principal a live API token names; None for an unknown, expired or revoked one."""
    if token.startswith(workload_tokens.PREFIX):
        return _workload_principal(session, token)
    if not token.startswith(("gp_", "gps_")):
        return None
    row = session.scalar(select(TokenRow).where(TokenRow.token_hash == hash_token(token)))
    at = time.time() if now is None else now
    if row is None or row.kind not in API_KINDS or row.revoked_at is not None:
        return None
    if row.expires_at is not None and row.expires_at <= at:
        return None
    user = session.get(UserRow, row.user_id)
    if user is None or user.disabled_at is not None:  # offboarded: nothing it holds signs in
        return None
    if row.last_used_at is None or at - row.last_used_at > 60:  # a write a minute at most per token
        row.last_used_at = at
        session.commit()
    return principal_for(session, user, scope=row.project_id, cap=row.role, token_id=row.id, kind=row.kind)


def disabled_holder(session: Session, token: str) -> str | None:
    """The name of the disabled user a live token of theirs belongs to, so its holder hears why it is refused (it
    holds the token: nothing is learnt); None for any other token."""
    if not token.startswith(("gp_", "gps_")):
        return None
    row = session.scalar(select(TokenRow).where(TokenRow.token_hash == hash_token(token)))
    if row is None or row.revoked_at is not None:
        return None
    user = session.get(UserRow, row.user_id)
    return user.name if user is not None and user.disabled_at is not None and user.deleted_at is None else None


def _workload_principal(session: Session, token: str) -> Principal | None:
    """A workload's own token: its owner, as a member of its project at most, while that attempt is live."""
    found = workload_tokens.verify(workload_tokens.key(session), token)
    if found is None:
        return None
    row = session.get(WorkloadRow, found[0])
    if row is None or row.attempt != found[1] or row.state not in LIVE:
        return None
    user = session.get(UserRow, row.owner_id)
    if user is None or user.disabled_at is not None:  # a workload kept running offboards with its owner's rights
        return None
    return principal_for(session, user, scope=row.project_id, cap="member", kind="workload")


class PrincipalCache:
    """Who a token belongs to, remembered for a few seconds: most requests then cost no query for it. Changes
    to users, memberships and tokens made through this server clear it at once; a revocation on another
    replica takes at most `ttl_s`."""

    def __init__(
        self, ttl_s: float = 5.0, clock: Callable[[], float] = time.monotonic, first_admin_file: Path | None = None
    ) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self.first_admin_file = first_admin_file
        """Where the first admin's token waits to be read; removed once that token is first used, so no copy of
        it outlives its first use (the store keeps only its hash)."""
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[float, Principal]] = {}
        self._generation = 0

    def peek(self, token: str) -> Principal | None:
        """The cached principal, without touching the database."""
        with self._lock:
            hit = self._entries.get(hash_token(token))
        return hit[1] if hit is not None and hit[0] > self._clock() else None

    def get(self, session: Session, token: str) -> Principal | None:
        hit = self.peek(token)
        if hit is not None:
            return hit
        key = hash_token(token)
        now = self._clock()
        with self._lock:
            generation = self._generation
        who = authenticate(session, token)
        if who is not None and self.first_admin_file is not None and who.is_admin:
            with contextlib.suppress(OSError):
                if self.first_admin_file.read_text().strip() == token:
                    self.first_admin_file.unlink()
        if who is not None:
            with self._lock:
                if len(self._entries) > 10_000:
                    self._entries.clear()
                # Read before a clear() that came meanwhile (a user disabled, a member removed): what it read
                # may be what the clear was for, so it is not remembered.
                if generation == self._generation:
                    self._entries[key] = (now + self.ttl_s, who)
        return who

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._generation += 1
