"""Signing in with a name and password: scrypt-hashed passwords, and short-lived signed session tokens.

A session token is `gps_<user id>_<expiry>_<HMAC>`, signed with the server's secret: nothing to store, and it
dies on its own. Users' long-lived tokens stay as they are.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.services.auth import Principal
from gpupool.services.errors import Invalid, NotFound, ServiceError
from gpupool.store.tables import UserRow

SESSION_TTL_S = 12 * 3600
_SCRYPT = {"n": 2**14, "r": 8, "p": 1}


class Unauthorized(ServiceError):
    status = 401


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, dklen=32, **_SCRYPT)
    return f"scrypt${salt.hex()}${digest.hex()}"


def check_password(password: str, stored: str | None) -> bool:
    if not stored or not stored.startswith("scrypt$"):
        return False
    _, salt, digest = stored.split("$")
    got = hashlib.scrypt(password.encode(), salt=bytes.fromhex(salt), dklen=32, **_SCRYPT)
    return hmac.compare_digest(got.hex(), digest)


def _sign(secret: bytes, user_id: int, expiry: int) -> str:
    return hmac.new(secret, f"{user_id}.{expiry}".encode(), hashlib.sha256).hexdigest()


def session_token(secret: bytes, user_id: int, now: float, ttl_s: float = SESSION_TTL_S) -> tuple[str, int]:
    expiry = int(now + ttl_s)
    return f"gps_{user_id}_{expiry}_{_sign(secret, user_id, expiry)}", expiry


def session_user(secret: bytes, token: str, now: float) -> int | None:
    """The user a valid, unexpired session token names; None otherwise."""
    parts = token.split("_")
    if len(parts) != 4 or parts[0] != "gps" or not all(p.isascii() and p.isdigit() for p in parts[1:3]):
        return None
    user_id, expiry = int(parts[1]), int(parts[2])
    if expiry < now or not hmac.compare_digest(_sign(secret, user_id, expiry), parts[3]):
        return None
    return user_id


def login(session: Session, name: str, password: str, secret: bytes) -> tuple[str, int]:
    user = session.scalar(select(UserRow).where(UserRow.name == name))
    # The same answer, and about the same work, whether the name exists or not.
    ok = check_password(password, user.password_hash if user else hash_password("x"))
    if user is None or not ok:
        raise Unauthorized("wrong name or password")
    return session_token(secret, user.id, time.time())


def set_password(session: Session, who: Principal, name: str, password: str) -> None:
    if who.name != name:
        who.require_admin()
    if len(password) < 8 or len(password) > 1024:
        raise Invalid("a password has 8 to 1024 characters")
    user = session.scalar(select(UserRow).where(UserRow.name == name))
    if user is None:
        raise NotFound(f"no user named {name!r}")
    user.password_hash = hash_password(password)
    session.commit()
