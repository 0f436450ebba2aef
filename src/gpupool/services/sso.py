"""Single sign-on: a verified OpenID Connect `Identity` becomes a gpupool user with a session.

Users are keyed by (issuer, subject), never by email. The provider is authoritative for an SSO user's rights:
every login replaces the user's memberships with what the `RoleMap` grants for the groups in the ID token, and a
login whose groups grant nothing is refused (default deny) and creates no user.

Grants: `admin` makes the user a platform admin; `department:NAME:admin` a department admin (a membership with
role admin on the department); `department:NAME:member|viewer` that role on every project of the department
(a department membership means only 'admin'); `project:NAME:ROLE` that role on the project. The strongest
role wins where several grants reach one project. Queues the map names that do not exist are skipped, logged.

Also here: the HMAC-signed values the browser keeps between the two halves of a login (`seal`, `unseal`), and
the device logins under way for the CLI (`DeviceLogins`), which live in this server process's memory.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.services.auth import RANK, Principal, principal_for
from gpupool.services.errors import ServiceError
from gpupool.services.oidc import DeviceAuthorization, Identity, OidcClient, RoleMap
from gpupool.services.sessions import open_session
from gpupool.store.tables import MembershipRow, QueueRow, UserRow

log = logging.getLogger("gpupool.sso")

NO_ACCESS = "your groups give you no access to gpupool"
DISABLED = "your gpupool account is disabled: an admin can enable it again"


class Refused(ServiceError):
    """A login this server refuses; `code` is a short word fit for a URL (no provider text in it)."""

    status = 403

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class DeviceLogin:
    device: DeviceAuthorization
    expires_at: float
    interval: float
    next_poll_at: float


class DeviceLogins:
    """Device logins under way, keyed by a random 256-bit handle; each expires with its device code."""

    def __init__(self, limit: int = 1000, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self._clock = clock
        self._lock = threading.Lock()
        self._items: dict[str, DeviceLogin] = {}

    def add(self, device: DeviceAuthorization) -> str | None:
        """The new login's handle; None when `limit` logins are already under way."""
        now = self._clock()
        with self._lock:
            for handle in [h for h, d in self._items.items() if d.expires_at <= now]:
                del self._items[handle]
            if len(self._items) >= self.limit:
                return None
            handle = secrets.token_urlsafe(32)
            self._items[handle] = DeviceLogin(device, now + device.expires_in, device.interval, now + device.interval)
            return handle

    def take_turn(self, handle: str) -> tuple[DeviceLogin | None, float]:
        """The login and 0, if this poll may go to the provider now; (login, seconds to wait) if it comes too
        soon; (None, 0) if there is no such login, or it expired."""
        now = self._clock()
        with self._lock:
            found = self._items.get(handle)
            if found is None or found.expires_at <= now:
                self._items.pop(handle, None)
                return None, 0.0
            if now < found.next_poll_at - 1.0:  # a second of slack for the client's timing
                return found, found.next_poll_at - now
            found.next_poll_at = now + found.interval
            return found, 0.0

    def slow_down(self, login: DeviceLogin, by: float) -> None:
        with self._lock:
            login.interval += by
            login.next_poll_at = self._clock() + login.interval

    def drop(self, handle: str) -> None:
        with self._lock:
            self._items.pop(handle, None)


@dataclass
class Sso:
    """What the API needs for single sign-on: the provider's client, the role map and a key to sign with."""

    client: OidcClient
    roles: RoleMap
    key: bytes
    devices: DeviceLogins = field(default_factory=DeviceLogins)


# --- values the browser keeps for us, signed ----------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def seal(key: bytes, purpose: str, data: dict[str, Any], ttl_s: float, now: float | None = None) -> str:
    """`data` with an expiry, signed with HMAC-SHA256 for one purpose (a value sealed for one is refused by
    another). Readable by whoever holds it: put nothing secret from the holder in it."""
    body = _b64(json.dumps({**data, "exp": (time.time() if now is None else now) + ttl_s}).encode())
    mac = hmac.new(key, f"{purpose}|{body}".encode(), hashlib.sha256).digest()
    return f"{body}.{_b64(mac)}"


def unseal(key: bytes, purpose: str, value: str | None, now: float | None = None) -> dict[str, Any] | None:
    """The data `seal` signed, or None if the value is missing, altered, for another purpose, or expired."""
    if not value or len(value) > 4096 or value.count(".") != 1:
        return None
    body, mac = value.split(".")
    want = hmac.new(key, f"{purpose}|{body}".encode(), hashlib.sha256).digest()
    try:
        if not hmac.compare_digest(_unb64(mac), want):
            return None
        data = json.loads(_unb64(body))
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("exp"), (int, float)):
        return None
    return data if data["exp"] > (time.time() if now is None else now) else None


# --- identity → user --------------------------------------------------------------------------------------

_UNSAFE = re.compile(r"[^a-z0-9]+")


def base_name(identity: Identity) -> str:
    """A DNS-safe name from the email's local part, else the `name` claim: lowercase letters, digits and '-'."""
    for source in (identity.email.partition("@")[0], identity.name or ""):
        stem = _UNSAFE.sub("-", source.lower()).strip("-")[:55].rstrip("-")
        if stem:
            return f"u-{stem}" if stem.startswith("svc-") else stem  # svc-* names are service accounts'
    return "user"


def _unique_name(session: Session, stem: str) -> str:
    taken = set(session.scalars(select(UserRow.name).where(UserRow.name.like(f"{stem}%"))))
    if stem not in taken:
        return stem
    n = 2
    while f"{stem}-{n}" in taken:
        n += 1
    return f"{stem}-{n}"


def _memberships(session: Session, roles: RoleMap, groups: tuple[str, ...]) -> tuple[bool, dict[int, str]]:
    """(admin?, queue id → role) that these groups grant, for the queues that exist."""
    admin = False
    out: dict[int, str] = {}

    def grant(queue_id: int, role: str) -> None:
        if RANK[role] > RANK.get(out.get(queue_id, ""), 0):
            out[queue_id] = role

    for g in roles.grants(groups):
        if g.kind == "admin":
            admin = True
            continue
        queue = session.scalar(select(QueueRow).where(QueueRow.name == g.queue, QueueRow.kind == g.kind))
        if queue is None:
            log.warning("single sign-on: the role map names the %s %r, which does not exist; skipped", g.kind, g.queue)
            continue
        if g.kind == "project" or g.role == "admin":
            grant(queue.id, g.role)
        else:  # a department's member or viewer: that role on each of its projects
            for p in session.scalars(select(QueueRow).where(QueueRow.parent_id == queue.id)):
                if p.kind == "project":
                    grant(p.id, g.role)
    return admin, out


def sign_in(
    session: Session, identity: Identity, roles: RoleMap, now: float | None = None, retried: bool = False
) -> tuple[str, float, Principal]:
    """A session for this identity: the user found (or made) by issuer and subject, with the memberships the
    map grants now. Refused for an unverified email, or when the groups grant nothing."""
    if not identity.email_verified:
        raise Refused("email_unverified", "the identity provider has not verified this email address")
    at = time.time() if now is None else now
    user = session.scalar(select(UserRow).where(UserRow.issuer == identity.issuer, UserRow.subject == identity.subject))
    if user is not None and user.disabled_at is not None:  # offboarded here, whatever the provider's groups say
        raise Refused("disabled", DISABLED)
    admin, grants = _memberships(session, roles, identity.groups)
    if not admin and not grants:
        if user is not None:  # the provider took everything away: so does gpupool
            session.execute(delete(MembershipRow).where(MembershipRow.user_id == user.id))
            user.role = "member"
            session.commit()
        raise Refused("no_access", NO_ACCESS)
    if user is None:
        user = UserRow(
            name=_unique_name(session, base_name(identity)), role="member", kind="person",
            issuer=identity.issuer, subject=identity.subject, email=identity.email, created_at=at,
        )  # fmt: skip
        session.add(user)
        try:
            session.flush()
        except IntegrityError:
            # Two first sign-ins at once: the other made the user (or took the name); once more finds it.
            session.rollback()
            if retried:
                raise
            return sign_in(session, identity, roles, now, retried=True)
    user.email = identity.email
    viewer_only = bool(grants) and all(r == "viewer" for r in grants.values())
    user.role = "admin" if admin else "viewer" if viewer_only else "member"
    session.execute(delete(MembershipRow).where(MembershipRow.user_id == user.id))
    for queue_id, role in sorted(grants.items()):
        session.add(MembershipRow(user_id=user.id, project_id=queue_id, role=role))
    session.commit()
    token, row = open_session(session, user, at)
    return token, row.expires_at or at, principal_for(session, user, token_id=row.id, kind="session")
