"""Code that goes with a job: blobs and manifests a project uploads, what a workload may read of them, the tokens
that let a Kubernetes init container fetch one workload's code, and collection of what nothing uses.

Bytes live in the blob area (gpupool.store.blobs), shared by content. Rights live in the store: a project may
use a blob once it has sent its bytes (CodeBlobRow), so asking which blobs the server lacks never tells one
project what another uploaded; a blob is read back only through a workload whose code names it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import CursorResult, delete, func, select
from sqlalchemy.orm import Session

from gpupool.models.code import CodeManifest, CodeStored, tree_problem
from gpupool.services import audit
from gpupool.services.auth import Principal
from gpupool.services.errors import Conflict, Forbidden, Invalid, NotFound, ServiceError
from gpupool.store import server_state
from gpupool.store.blobs import CHUNK_BYTES, BlobStore, digest_of
from gpupool.store.tables import CodeBlobRow, CodeManifestRow, QueueRow, WorkloadRow

GC_GRACE_S = 86400.0
"""How long an upload no workload names is kept: long enough to submit it, and to resubmit without sending it."""
TOKEN_KEY = "code-token-key"
_TOKEN = re.compile(r"^gpc_([0-9]{1,10})_([0-9a-f]{64})$")


class TooLarge(ServiceError):
    status = 413


def _project(session: Session, who: Principal, name: str) -> QueueRow:
    project = session.scalar(select(QueueRow).where(QueueRow.name == name, QueueRow.kind == "project"))
    if project is None or not who.can_read(project.id):
        raise NotFound(f"no project named {name!r}")
    if not who.can_write(project.id):
        raise Forbidden(f"your role ({who.role}) cannot upload code to {name!r}")
    audit.note(tenant=project.name, obj=f"code/{project.name}")
    return project


def missing(session: Session, store: BlobStore, who: Principal, project: str, digests: Iterable[str]) -> list[str]:
    """Which of `digests` this project must still send: never sent by it, or gone from the blob area."""
    p = _project(session, who, project)
    asked = list(dict.fromkeys(digests))
    held = set(
        session.scalars(select(CodeBlobRow.digest).where(CodeBlobRow.project_id == p.id, CodeBlobRow.digest.in_(asked)))
    )
    return [d for d in asked if d not in held or not store.has(d)]


def put_blob(
    session: Session, store: BlobStore, who: Principal, project: str, digest: str, data: bytes, quota: int | None = None
) -> bool:
    """Keep a chunk the project sent (checked against its digest); True where the blob area lacked it. `quota`: the
    most bytes of code the project may hold (TooLarge past it)."""
    p = _project(session, who, project)
    if len(data) > CHUNK_BYTES:
        raise TooLarge(f"a blob is at most {CHUNK_BYTES} bytes; cut files into chunks of that size")
    _within_quota(session, p, digest, len(data), quota)
    try:
        new = store.put(digest, data)
    except ValueError as e:
        raise Invalid(str(e)) from None
    _hold(session, p.id, digest, len(data), time.time())
    session.commit()
    return new


def _within_quota(session: Session, p: QueueRow, digest: str, size: int, quota: int | None) -> None:
    """TooLarge where keeping `size` more bytes under `digest` (one the project does not hold yet) would take the
    project past `quota`: chunks and manifests alike count."""
    if quota is None or session.get(CodeBlobRow, (p.id, digest)) is not None:
        return
    total = select(func.coalesce(func.sum(CodeBlobRow.size), 0)).where(CodeBlobRow.project_id == p.id)
    held = int(session.scalar(total) or 0)
    if held + size > quota:
        raise TooLarge(
            f"project {p.name!r} holds {mib(held)} of code, and may hold {mib(quota)}: uploads no workload names "
            f"are collected {GC_GRACE_S / 3600:g} hours after they were sent (an admin sets the quota: code_quota_mib)"
        )


def _hold(session: Session, project_id: int, digest: str, size: int, now: float) -> None:
    row = session.get(CodeBlobRow, (project_id, digest))
    if row is None:
        session.add(CodeBlobRow(project_id=project_id, digest=digest, size=size, created_at=now))
    else:
        row.created_at = now  # used again: collection counts its grace from now


def check_paths(manifest: CodeManifest) -> None:
    """Paths relative and normal, sorted, each once, none inside a file; every link resolved through the tree's
    other links to a place inside it, loops refused (gpupool.models.code.tree_problem): 422 with the reason."""
    problem = tree_problem(manifest)
    if problem is not None:
        raise Invalid(problem)


def largest(manifest: CodeManifest, count: int = 5) -> str:
    top = sorted((f for f in manifest.files if f.link is None), key=lambda f: (-f.size, f.path))[:count]
    return ", ".join(f"{f.path} ({mib(f.size)})" for f in top)


def mib(size: int) -> str:
    if size >= 2**20:
        return f"{size / 2**20:.1f} MiB"
    return f"{size / 1024:.1f} KiB" if size >= 1024 else f"{size} B"


def put_manifest(
    session: Session,
    store: BlobStore,
    who: Principal,
    project: str,
    manifest: CodeManifest,
    max_bytes: int,
    quota: int | None = None,
) -> CodeStored:
    """Keep a code tree whose chunks the project has sent: its `sha256:<hex>`, which a workload's code names.
    `quota`: the most bytes of code the project may hold (the manifest's own bytes count too)."""
    p = _project(session, who, project)
    check_paths(manifest)
    total = sum(f.size for f in manifest.files)
    if total > max_bytes:
        raise TooLarge(
            f"the code is {mib(total)}, over this server's limit of {mib(max_bytes)}; the largest files: "
            f"{largest(manifest)} (list what it need not carry in .gpupoolignore)"
        )
    chunks = sorted({c for f in manifest.files for c in f.chunks})
    query = select(CodeBlobRow.digest, CodeBlobRow.size).where(
        CodeBlobRow.project_id == p.id, CodeBlobRow.digest.in_(chunks)
    )
    sizes: dict[str, int] = {digest: size for digest, size in session.execute(query)}
    lacking = [c for c in chunks if c not in sizes or not store.has(c)]
    if lacking:
        raise Conflict(f"{len(lacking)} blobs were not uploaded first, such as {lacking[0]}: send them and retry")
    for f in manifest.files:
        if f.link is None and sum(sizes[c] for c in f.chunks) != f.size:
            raise Invalid(f"file {f.path[:200]!r}: its chunks hold other than its {f.size} bytes")
    body = manifest.canonical()
    digest = digest_of(body)
    _within_quota(session, p, digest, len(body), quota)
    store.put(digest, body)
    now = time.time()
    _hold(session, p.id, digest, len(body), now)
    for c in chunks:
        _hold(session, p.id, c, sizes[c], now)
    row = session.get(CodeManifestRow, (p.id, digest))
    if row is None:
        row = CodeManifestRow(project_id=p.id, digest=digest, files=len(manifest.files), size=total, chunks=chunks,
                              created_at=now, created_by=who.name)  # fmt: skip
        session.add(row)
    row.created_at = now
    session.commit()
    return CodeStored(code=digest, files=len(manifest.files), size=total)


def manifest_row(session: Session, project_id: int, digest: str) -> CodeManifestRow | None:
    return session.get(CodeManifestRow, (project_id, digest))


def check_submitted(session: Session, project_id: int, project: str, digest: str | None) -> None:
    """A workload's code must be a manifest its project uploaded (422 with the reason otherwise)."""
    if digest is not None and manifest_row(session, project_id, digest) is None:
        raise Invalid(
            f"code {digest} is not a code tree project {project!r} uploaded (upload it with "
            "gpupool.client.code.upload, or submit without code)"
        )


# -- reading a workload's code --------------------------------------------------------------------------------
def read_manifest(store: BlobStore, row: WorkloadRow) -> bytes:
    if row.code is None or not store.has(row.code):
        raise NotFound(f"workload {row.name!r} has no code")
    return store.read(row.code)


def read_blob(session: Session, store: BlobStore, row: WorkloadRow, digest: str) -> bytes:
    """A chunk of the workload's code: only one its manifest names."""
    m = manifest_row(session, row.project_id, row.code) if row.code is not None else None
    if m is None or digest not in m.chunks or not store.has(digest):
        raise NotFound(f"workload {row.name!r} has no blob {digest[:80]}")
    return store.read(digest)


def _key(session: Session) -> bytes:
    return bytes.fromhex(server_state.get_or_create(session, TOKEN_KEY, lambda: secrets.token_hex(32)))


def mint_token(session: Session, row: WorkloadRow) -> str:
    """A token that reads this workload's code and nothing else (not another workload's, not the API): what its
    Kubernetes init container presents. Derived from a key the store keeps, so every replica mints the same."""
    mac = hmac.new(_key(session), f"code:{row.id}:{row.code}".encode(), hashlib.sha256).hexdigest()
    return f"gpc_{row.id}_{mac}"


def is_code_token(token: str) -> bool:
    return token.startswith("gpc_")


def token_workload(session: Session, token: str) -> WorkloadRow | None:
    """The workload a code token was minted for, or None for a token that is not one."""
    m = _TOKEN.fullmatch(token)
    if m is None:
        return None
    row = session.get(WorkloadRow, int(m.group(1)))
    if row is None or row.code is None:
        return None
    want = hmac.new(_key(session), f"code:{row.id}:{row.code}".encode(), hashlib.sha256).hexdigest()
    return row if hmac.compare_digest(want, m.group(2)) else None


# -- collection ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Collected:
    manifests: int
    blobs: int
    bytes: int


def collect(session: Session, store: BlobStore, grace_s: float = GC_GRACE_S, now: float | None = None) -> Collected:
    """Forget uploads no workload names, once `grace_s` has passed since they were last sent or used, and remove
    bytes no project holds any more. Each delete repeats its age condition, so an upload that uses a row again
    meanwhile keeps it."""
    cutoff = (time.time() if now is None else now) - grace_s
    named = select(WorkloadRow.code).where(
        WorkloadRow.code.is_not(None), WorkloadRow.project_id == CodeManifestRow.project_id
    )
    result = session.execute(
        delete(CodeManifestRow)
        .where(CodeManifestRow.created_at < cutoff, CodeManifestRow.digest.not_in(named))
        .execution_options(synchronize_session=False)
    )
    gone = cast(CursorResult[Any], result).rowcount
    kept: dict[int, set[str]] = {}
    for m in session.scalars(select(CodeManifestRow)):
        kept.setdefault(m.project_id, set()).update([m.digest, *m.chunks])
    old = session.execute(select(CodeBlobRow.project_id, CodeBlobRow.digest).where(CodeBlobRow.created_at < cutoff))
    for project_id, digest in old.all():
        if digest not in kept.get(project_id, set()):
            session.execute(
                delete(CodeBlobRow).where(
                    CodeBlobRow.project_id == project_id, CodeBlobRow.digest == digest, CodeBlobRow.created_at < cutoff
                )
            )
    session.commit()
    held = set(session.scalars(select(CodeBlobRow.digest).distinct()))
    blobs = size = 0
    for digest, written in list(store.stored()):
        if digest not in held and written < cutoff:
            size += store.path(digest).stat().st_size
            store.remove(digest)
            blobs += 1
    store.sweep_tmp(grace_s)
    return Collected(gone, blobs, size)
