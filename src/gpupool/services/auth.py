"""Bearer tokens (stored as SHA-256: they are 256-bit random, so a slow hash buys nothing) and the caller."""

from __future__ import annotations

import hashlib
import secrets
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


def authenticate(session: Session, token: str) -> Principal | None:
    if not token or len(token) > 256:
        return None
    user = session.scalar(select(UserRow).where(UserRow.token_hash == hash_token(token)))
    if user is None:
        return None
    projects = session.scalars(select(MembershipRow.project_id).where(MembershipRow.user_id == user.id))
    return Principal(user.id, user.name, user.role, frozenset(projects))
