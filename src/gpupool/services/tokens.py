"""Tokens people manage: personal tokens (optionally narrowed to a project and a role), service tokens of a
project (for CI and pipelines: a service account of the project, no person behind it), and API keys that open
one inference service. Each is shown once and kept as its hash; each expires; each can be revoked."""

from __future__ import annotations

import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.models.access import TokenCreate, TokenCreated, TokenPublic
from gpupool.services import apps
from gpupool.services.auth import RANK, Principal, hash_token, new_token, principal_for, require_own_login
from gpupool.services.errors import Forbidden, Invalid, NotFound
from gpupool.store.tables import MembershipRow, QueueRow, TokenRow, UserRow, WorkloadRow

DAY_S = 86400.0
PREFIX = {"personal": "gp_", "service": "gp_", "apikey": "gpk_", "metrics": "gpm_"}
LISTED = ("personal", "service", "session", "apikey", "metrics")
"""What people see and revoke here; the apps host's tickets and sessions (`apps`) end with the user's sessions."""


def _project(session: Session, who: Principal, name: str) -> QueueRow:
    row = session.scalar(select(QueueRow).where(QueueRow.name == name, QueueRow.kind == "project"))
    if row is None or not who.can_read(row.id):
        raise NotFound(f"no project named {name!r}")
    return row


def public(session: Session, row: TokenRow) -> TokenPublic:
    user = session.get(UserRow, row.user_id)
    project = session.get(QueueRow, row.project_id) if row.project_id is not None else None
    return TokenPublic(
        id=row.id, name=row.name, kind=row.kind, user=user.name if user else "?",
        project=project.name if project else None, role=row.role, app=row.app, created_at=row.created_at,
        expires_at=row.expires_at, revoked_at=row.revoked_at, last_used_at=row.last_used_at,
    )  # fmt: skip


def create(session: Session, who: Principal, body: TokenCreate) -> TokenCreated:
    now = time.time()
    require_own_login(who, "make tokens")  # a token made by a narrower one could be wider, or outlive it
    if body.kind == "metrics" and (not who.is_admin or body.project is not None):
        raise Forbidden("a scrape token for /metrics is an admin's to make, for the whole platform")
    project = _project(session, who, body.project) if body.project else None
    mine = who.projects.get(project.id, "") if project else ""
    if project is not None and who.is_admin:
        mine = "admin"
    role = body.role or ("member" if body.kind == "service" else None)
    if body.kind in ("service", "apikey"):
        if project is None:
            raise Invalid(f"a {body.kind} token belongs to a project: name it")
        if not who.can_write(project.id):
            raise Forbidden(f"your role in {project.name!r} ({mine or 'none'}) cannot make {body.kind} tokens")
    if role is not None and project is not None and RANK[role] > RANK.get(mine, 0):
        raise Forbidden(f"a token cannot do more than you: your role in {project.name!r} is {mine}")
    if role == "member" and project is None and who.role == "viewer":
        raise Forbidden("a token cannot do more than you: you are a viewer")
    user_id = who.id
    if body.kind == "service":
        assert project is not None
        user_id = _service_account(session, project, body.name, role or "member", now).id
    app = None
    if body.kind == "apikey":
        assert project is not None
        if body.app is None:
            raise Invalid("an apikey opens one inference service: name it with app")
        service = session.scalar(
            select(WorkloadRow).where(WorkloadRow.project_id == project.id, WorkloadRow.live_name == body.app)
        )
        if service is None or service.type != "inference":
            raise NotFound(f"no inference service named {body.app!r} in {project.name!r}")
        app, role = body.app, None
    token = new_token(PREFIX[body.kind])
    row = TokenRow(
        user_id=user_id, kind=body.kind, name=body.name, token_hash=hash_token(token),
        project_id=project.id if project else None, role=role, app=app, created_by=who.id, created_at=now,
        expires_at=now + body.expires_in_days * DAY_S,
    )  # fmt: skip
    session.add(row)
    session.commit()
    return TokenCreated(**public(session, row).model_dump(), token=token)


def _service_account(session: Session, project: QueueRow, name: str, role: str, now: float) -> UserRow:
    """The project's service account `svc-<project>-<name>`: a member (or viewer) of that project only."""
    account = f"svc-{project.name}-{name}"[:63]
    user = session.scalar(select(UserRow).where(UserRow.name == account))
    if user is None:
        user = UserRow(name=account, role=role, kind="service", created_at=now)
        session.add(user)
        session.flush()
        session.add(MembershipRow(user_id=user.id, project_id=project.id, role=role))
    elif user.kind != "service":
        raise Invalid(f"{account!r} is the name of a person")
    return user


def _visible(who: Principal, row: TokenRow) -> bool:
    """Your own tokens; a project's service tokens and keys for those who may write to it; all for admins."""
    if row.kind not in LISTED:
        return False
    if who.is_admin or row.user_id == who.id or row.created_by == who.id:
        return True
    return row.kind in ("service", "apikey") and row.project_id is not None and who.can_write(row.project_id)


def list_tokens(session: Session, who: Principal, include_revoked: bool = False) -> list[TokenPublic]:
    now = time.time()
    query = select(TokenRow).where(TokenRow.kind.in_(LISTED)).order_by(TokenRow.id)
    if not who.is_admin:  # narrowed in SQL (sessions pile up for everyone); `_visible` stays the rule
        projects = sorted(who.projects)
        query = query.where(
            (TokenRow.user_id == who.id)
            | (TokenRow.created_by == who.id)
            | (TokenRow.kind.in_(("service", "apikey")) & TokenRow.project_id.in_(projects))
        )
    if not include_revoked:
        query = query.where(TokenRow.revoked_at.is_(None), TokenRow.expires_at.is_(None) | (TokenRow.expires_at > now))
    return [public(session, row) for row in session.scalars(query) if _visible(who, row)]


def revoke(session: Session, who: Principal, token_id: int) -> TokenPublic:
    row = session.get(TokenRow, token_id)
    if row is None or not _visible(who, row):
        raise NotFound(f"no token {token_id}")
    if row.revoked_at is None:
        row.revoked_at = time.time()
        if row.kind in ("personal", "session"):
            # What the portal's cookie held may have made apps-host sessions (`apps.mint_ticket`); they record no
            # parent, so every one of the user's goes with it, as on signing out (they reopen from the portal).
            apps.end_app_sessions(session, row.user_id)
        session.commit()
    return public(session, row)


def scrape_allowed(session: Session, token: str, now: float | None = None) -> bool:
    """Whether a token is a live scrape token (it reads /metrics, every tenant's, and nothing else)."""
    row = session.scalar(select(TokenRow).where(TokenRow.token_hash == hash_token(token), TokenRow.kind == "metrics"))
    at = time.time() if now is None else now
    if row is None or row.revoked_at is not None or (row.expires_at is not None and row.expires_at <= at):
        return False
    # It reads what an admin reads: only while its maker is one, and is not offboarded.
    maker = session.get(UserRow, row.user_id)
    return maker is not None and maker.disabled_at is None and maker.role == "admin"


def apikey_opens(session: Session, key: str, project: str, app: str, now: float | None = None) -> bool:
    """Whether an API key is live and made for this project's service."""
    if not key.startswith("gpk_"):
        return False
    row = session.scalar(select(TokenRow).where(TokenRow.token_hash == hash_token(key), TokenRow.kind == "apikey"))
    at = time.time() if now is None else now
    if row is None or row.revoked_at is not None or (row.expires_at is not None and row.expires_at <= at):
        return False
    queue = session.get(QueueRow, row.project_id) if row.project_id is not None else None
    if queue is None or queue.name != project or row.app != app:
        return False
    # A key opens what its maker may still open: not once its maker is disabled or has left the project.
    maker = session.get(UserRow, row.user_id)
    return maker is not None and maker.disabled_at is None and principal_for(session, maker).can_write(queue.id)
