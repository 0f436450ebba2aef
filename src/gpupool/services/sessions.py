"""Signing in with a name and password: scrypt-hashed passwords, sessions that can be revoked, and a limit on
guessing.

A session is a random `gps_` token kept (hashed) with the others, for 12 hours: logging out revokes it, and a
password change revokes every other session of the user.

Guessing is limited per account and address pair (an attacker locks out only their own address, never the
user's), and per address across accounts. A locked pair waits 30 s after its fifth failure, doubling with each
failure after, up to 15 minutes. Every refusal costs about one scrypt, whether the name exists or not.

Also here: the first start's admin (`first_admin`), and the key that signs what a browser keeps between the
halves of a single sign-on (`session_key`); both live in the store, so a server with an empty data dir neither
bootstraps again nor forgets the key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.services import apps
from gpupool.services.auth import Principal, hash_token, new_token, principal_for, require_own_login
from gpupool.services.errors import Forbidden, Invalid, NotFound, ServiceError
from gpupool.store import server_state
from gpupool.store.tables import TokenRow, UserRow

SESSION_TTL_S = 12 * 3600
_SCRYPT = {"n": 2**14, "r": 8, "p": 1}
_DUMMY = "scrypt$" + "00" * 16 + "$" + "00" * 32
SESSION_PREFIX = "gps_"
CSRF_COOKIE, CSRF_HEADER = "gpupool_csrf", "X-CSRF-Token"


def csrf_token(token: str) -> str:
    """The CSRF token of a browser session: derived from its session token (one way), so the server keeps no
    state for it and a cookie planted by a neighbouring host cannot match a session it does not know."""
    return hashlib.sha256(b"gpupool-csrf\0" + token.encode()).hexdigest()[:40]


class Unauthorized(ServiceError):
    status = 401


class TooManyAttempts(ServiceError):
    status = 429

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, dklen=32, **_SCRYPT)
    return f"scrypt${salt.hex()}${digest.hex()}"


def check_password(password: str, stored: str | None) -> bool:
    """Costs one scrypt whatever `stored` is, so a missing user or password answers as slowly as a wrong one."""
    real = stored is not None and stored.startswith("scrypt$") and stored.count("$") == 2
    _, salt, digest = (stored if real and stored else _DUMMY).split("$")
    got = hashlib.scrypt(password.encode(), salt=bytes.fromhex(salt), dklen=32, **_SCRYPT)
    return hmac.compare_digest(got.hex(), digest) and real


@dataclass
class _Strikes:
    failures: int = 0
    until: float = 0.0


class LoginLimiter:
    """Failed sign-ins per (account, address) and per address, in memory (one server process)."""

    PAIR_FREE = 5
    PAIR_MAX_S = 900.0
    ADDRESS_FAILURES = 50
    ADDRESS_WINDOW_S = 600.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._pairs: dict[tuple[str, str], _Strikes] = {}
        self._addresses: dict[str, list[float]] = {}

    def check(self, name: str, address: str) -> None:
        now = self._clock()
        with self._lock:
            pair = self._pairs.get((name, address))
            recent = [t for t in self._addresses.get(address, []) if now - t < self.ADDRESS_WINDOW_S]
            self._addresses[address] = recent
        if pair is not None and pair.until > now:
            wait = math.ceil(pair.until - now)
            raise TooManyAttempts(f"too many failed sign-ins; try again in {wait} s", wait)
        if len(recent) >= self.ADDRESS_FAILURES:
            wait = math.ceil(self.ADDRESS_WINDOW_S - (now - recent[0]))
            raise TooManyAttempts(f"too many failed sign-ins from this address; try again in {wait} s", wait)

    def failed(self, name: str, address: str) -> None:
        now = self._clock()
        with self._lock:
            pair = self._pairs.setdefault((name, address), _Strikes())
            pair.failures += 1
            if pair.failures >= self.PAIR_FREE:
                pair.until = now + min(self.PAIR_MAX_S, 30.0 * 2 ** (pair.failures - self.PAIR_FREE))
            self._addresses.setdefault(address, []).append(now)
            if len(self._pairs) > 100_000:
                self._pairs.clear()

    def succeeded(self, name: str, address: str) -> None:
        with self._lock:
            self._pairs.pop((name, address), None)


def open_session(session: Session, user: UserRow, now: float) -> tuple[str, TokenRow]:
    token = new_token(SESSION_PREFIX)
    row = TokenRow(
        user_id=user.id, kind="session", name="portal", token_hash=hash_token(token), created_at=now,
        expires_at=now + SESSION_TTL_S,
    )  # fmt: skip
    session.add(row)
    session.commit()
    return token, row


def login(
    session: Session, name: str, password: str, address: str, limiter: LoginLimiter
) -> tuple[str, float, Principal]:
    """A new session for a name and password. Refusals say the same whether the name exists or not."""
    limiter.check(name, address)
    user = session.scalar(select(UserRow).where(UserRow.name == name, UserRow.kind == "person",
                                                UserRow.deleted_at.is_(None)))  # fmt: skip
    ok = check_password(password, user.password_hash if user else None)
    if user is None or not ok:
        limiter.failed(name, address)
        raise Unauthorized("wrong name or password")
    limiter.succeeded(name, address)
    if user.disabled_at is not None:  # told only to whoever knows the password
        raise Forbidden(f"the user {name!r} is disabled: an admin can enable it again")
    now = time.time()
    token, row = open_session(session, user, now)
    return token, row.expires_at or now, principal_for(session, user, token_id=row.id, kind="session")


def logout(session: Session, who: Principal) -> None:
    """Revoke the session (or token) the caller used; a portal session takes the user's apps-host sessions with it."""
    row = session.get(TokenRow, who.token_id) if who.token_id is not None else None
    if row is not None and row.revoked_at is None:
        row.revoked_at = time.time()
        if row.kind == "session":
            apps.end_app_sessions(session, row.user_id)
        session.commit()


def set_password(session: Session, who: Principal, name: str, password: str, current: str | None) -> None:
    """Your own password needs your current one (where you have one), and ends your other sessions. An admin
    may set anyone's. Either way only from the caller's whole identity (`require_own_login`): a first password
    set from a workload's or a narrowed token would be a login that outlives it, with every right of its user."""
    require_own_login(who, "set passwords")
    user = session.scalar(select(UserRow).where(UserRow.name == name, UserRow.kind == "person",
                                                UserRow.deleted_at.is_(None)))  # fmt: skip
    own = who.name == name
    if not own:
        who.require_admin()
    if user is None:
        raise NotFound(f"no user named {name!r}")
    if len(password) < 8 or len(password) > 1024:
        raise Invalid("a password has 8 to 1024 characters")
    if own and user.password_hash is not None and not check_password(current or "", user.password_hash):
        raise Forbidden("the current password is wrong")
    user.password_hash = hash_password(password)
    now = time.time()
    for row in session.scalars(
        select(TokenRow).where(TokenRow.user_id == user.id, TokenRow.kind == "session", TokenRow.revoked_at.is_(None))
    ):
        if row.id != who.token_id:
            row.revoked_at = now
    session.commit()


# --- the first start ----------------------------------------------------------------------------------------

_DONE = json.dumps({"state": "done"})


def session_key(session: Session, legacy: str | None = None) -> bytes:
    """The store's session key, made once for every server on the store. `legacy`: the key a server kept in
    its data dir before the store held it (hex), taken so that values it signed stay valid."""

    def make() -> str:
        if legacy is not None and len(legacy) == 64 and all(c in "0123456789abcdef" for c in legacy):
            return legacy
        return secrets.token_hex(32)

    return bytes.fromhex(server_state.get_or_create(session, server_state.SESSION_SECRET, make))


def first_admin(session: Session, held: str | None, name: str = "admin") -> str | None:
    """The first admin's token this server should keep in its data dir; None once the first start is over.

    The first server to start on an empty store makes the admin and its token (one transaction; a racing server
    loses the insert of the bootstrap state and reads the winner's). Until a first-admin token is used, a server
    whose data dir lacks one (`held`: what its file holds) gets one of its own, so a restart with an empty data
    dir, or another replica, never leaves the admin locked out. The first start is over once any of them has
    been used or revoked, or another admin exists; the unused ones are then revoked, and no server ever
    bootstraps again: not even with an empty data dir, and not after the used token's file is gone."""
    for _ in range(10):  # each round loses only to another server's committed change
        raw = server_state.read(session, server_state.BOOTSTRAP)
        if raw is None:
            if session.scalar(select(UserRow.id).limit(1)) is not None:
                # Users and no state: a store set up before this state, or another server's first start that
                # committed since the read above. Only the first makes "done" stick; the second is read again.
                if server_state.insert_once(session, server_state.BOOTSTRAP, _DONE):
                    session.commit()
                    return None
                session.rollback()
                continue
            pending = json.dumps({"state": "pending", "tokens": []})
            if not server_state.insert_once(session, server_state.BOOTSTRAP, pending):
                session.rollback()
                continue
            user = UserRow(name=name, role="admin", kind="person", created_at=time.time())
            session.add(user)
            session.flush()
            token, row = _issue(session, user.id)
            server_state.replace(session, server_state.BOOTSTRAP, pending, _state(user.id, [row.id]))
            session.commit()
            return token
        state = json.loads(raw)
        if state["state"] == "done":
            return None
        user_id, ids = int(state["user_id"]), [int(i) for i in state["tokens"]]
        rows = list(session.scalars(select(TokenRow).where(TokenRow.id.in_(ids))))
        if _over(session, user_id, ids, rows):
            now = time.time()
            for r in rows:
                if r.last_used_at is None and r.revoked_at is None:
                    r.revoked_at = now
            if server_state.replace(session, server_state.BOOTSTRAP, raw, _DONE):
                session.commit()
                return None
            session.rollback()
            continue
        if held is not None and hash_token(held) in {r.token_hash for r in rows}:
            return held
        token, row = _issue(session, user_id)
        if server_state.replace(session, server_state.BOOTSTRAP, raw, _state(user_id, [*ids, row.id])):
            session.commit()
            return token
        session.rollback()
    raise RuntimeError("the first start's state kept changing under this server")


def _state(user_id: int, tokens: list[int]) -> str:
    return json.dumps({"state": "pending", "user_id": user_id, "tokens": tokens})


def _issue(session: Session, user_id: int) -> tuple[str, TokenRow]:
    token, now = new_token(), time.time()
    row = TokenRow(user_id=user_id, kind="personal", name="initial", token_hash=hash_token(token), created_at=now)
    session.add(row)
    session.flush()
    return token, row


def _over(session: Session, user_id: int, ids: list[int], rows: list[TokenRow]) -> bool:
    if len(rows) != len(ids) or any(r.last_used_at is not None or r.revoked_at is not None for r in rows):
        return True
    admin = session.get(UserRow, user_id)
    other = session.scalar(select(UserRow.id).where(UserRow.role == "admin", UserRow.id != user_id).limit(1))
    return admin is None or admin.role != "admin" or other is not None
