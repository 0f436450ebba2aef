"""Bearer tokens (stored as SHA-256: they are 256-bit random, so a slow hash buys nothing) and the caller."""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.services.errors import Forbidden
from gpupool.store.tables import MembershipRow, UserRow


@dataclass(frozen=True, slots=True)
class Principal:
    id: int
    name: str
    role: str
    project_ids: frozenset[int]

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def can_read(self, project_id: int) -> bool:
        return self.is_admin or project_id in self.project_ids

    def can_write(self, project_id: int) -> bool:
        return self.is_admin or (self.role == "member" and project_id in self.project_ids)

    def require_admin(self) -> None:
        if not self.is_admin:
            raise Forbidden("only an admin may do this")


def new_token() -> str:
    return "gp_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class PrincipalCache:
    """Who a token belongs to, remembered for a few seconds: most requests then cost no query for it.
    Users and memberships change only through the admin API, which clears it."""

    def __init__(
        self, ttl_s: float = 5.0, clock: Callable[[], float] = time.monotonic, secret: bytes | None = None
    ) -> None:
        self.ttl_s = ttl_s
        self.secret = secret
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[float, Principal]] = {}

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
        who = authenticate(session, token, self.secret)
        if who is not None:
            with self._lock:
                if len(self._entries) > 10_000:
                    self._entries.clear()
                self._entries[key] = (now + self.ttl_s, who)
        return who

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


def authenticate(session: Session, token: str, secret: bytes | None = None) -> Principal | None:
    if not token or len(token) > 256:
        return None
    if token.startswith("gps_"):
        from gpupool.services.sessions import session_user

        user_id = session_user(secret, token, time.time()) if secret else None
        user = session.get(UserRow, user_id) if user_id is not None else None
    else:
        user = session.scalar(select(UserRow).where(UserRow.token_hash == hash_token(token)))
    if user is None:
        return None
    projects = session.scalars(select(MembershipRow.project_id).where(MembershipRow.user_id == user.id))
    return Principal(user.id, user.name, user.role, frozenset(projects))
