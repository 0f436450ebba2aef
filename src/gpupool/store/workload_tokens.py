"""A workload's own API token: what its processes call the API with (`gpupool submit` from a notebook), with its
owner's rights in its project and never more, for as long as that attempt runs.

Nothing is stored per token: it is `gpw_<workload>_<attempt>_<mac>`, the MAC keyed by a secret the store keeps (so
every replica mints and checks the same), and a server accepts it only while that attempt of the workload is live.
It is revoked by the workload's end, or its next attempt, without a write."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

from sqlalchemy.orm import Session

from gpupool.store import server_state

KEY = "workload-token-key"
PREFIX = "gpw_"
_TOKEN = re.compile(r"gpw_([0-9]{1,18})_([0-9]{1,9})_([0-9a-f]{64})")


def key(session: Session) -> bytes:
    """The signing key, made by the first server to ask (this commits the session where it makes it)."""
    return bytes.fromhex(server_state.get_or_create(session, KEY, lambda: secrets.token_hex(32)))


def _mac(signing: bytes, workload_id: int, attempt: int) -> str:
    return hmac.new(signing, f"workload:{workload_id}:{attempt}".encode(), hashlib.sha256).hexdigest()


def mint(signing: bytes, workload_id: int, attempt: int) -> str:
    return f"{PREFIX}{workload_id}_{attempt}_{_mac(signing, workload_id, attempt)}"


def verify(signing: bytes, token: str) -> tuple[int, int] | None:
    """The (workload, attempt) a token was minted for; None for one that is not a workload token or is forged."""
    m = _TOKEN.fullmatch(token)
    if m is None:
        return None
    workload_id, attempt = int(m.group(1)), int(m.group(2))
    return (workload_id, attempt) if hmac.compare_digest(_mac(signing, workload_id, attempt), m.group(3)) else None
