"""A project's volumes: created, listed and deleted by its members (viewers list them), mounted by the workloads
that name them, and refused deletion while a workload that is not finished mounts one."""

from __future__ import annotations

import posixpath
import time
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.backends.base import Storage, VolumeSpec
from gpupool.lifecycle.phases import TERMINAL
from gpupool.models.volumes import VolumeCreate, VolumeMount, VolumePublic
from gpupool.services import audit
from gpupool.services.auth import Principal
from gpupool.services.errors import Conflict, Forbidden, Invalid, NotFound
from gpupool.services.org import visible_queue
from gpupool.services.requests import parse_mib
from gpupool.store.tables import QueueRow, VolumeRow, WorkloadRow

MAX_VOLUME_BYTES = 10 * 2**40
"""The largest volume a project may create (10 TiB) unless the server's settings name another cap."""
MIN_VOLUME_BYTES = 8 * 2**20
"""The smallest: a filesystem needs room for its own bookkeeping."""
MAX_PER_PROJECT = 100
POD_WORKDIR = "/workspace"
"""A pod's working directory (gpupool.backends.kubernetes.manifests.CODE_DIR, which needs the kubernetes extra to
import; tests/kubernetes/test_volumes.py holds the two equal)."""
RESERVED_PATHS = (
    "/proc", "/dev", "/sys", "/run", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot",
    "/tmp", "/var", "/opt", "/root", "/home", "/srv", "/snap", "/nix", "/media", "/lost+found",
)  # fmt: skip
"""Where a volume may not be mounted: the system the sandbox shows read-only, the places it makes private, and the
host's own trees, where the local backend would make a mount point on the host (as root) that the host's services
or users then find (a directory where ~/.ssh/authorized_keys or a service's configuration would be)."""


def _public(row: VolumeRow, project: str, users: Sequence[str] = ()) -> VolumePublic:
    return VolumePublic(id=row.id, name=row.name, project=project, size_bytes=row.size_bytes,
                        created_at=row.created_at, created_by=row.created_by, in_use_by=sorted(users))  # fmt: skip


def _writable(session: Session, who: Principal, project: str, name: str) -> QueueRow:
    queue = visible_queue(session, who, project, "project")
    audit.note(tenant=project, obj=f"volume/{name}")
    if not who.can_write(queue.id):
        raise Forbidden(f"your role ({who.role}) cannot manage the volumes of {project!r}")
    return queue


def create(session: Session, who: Principal, body: VolumeCreate, cap_bytes: int = MAX_VOLUME_BYTES) -> VolumePublic:
    queue = _writable(session, who, body.project, body.name)
    size = parse_mib(body.size, "a volume's size") * 2**20
    if size < MIN_VOLUME_BYTES:
        raise Invalid(f"a volume's size is at least {MIN_VOLUME_BYTES // 2**20}MiB, not {body.size!r}")
    if size > cap_bytes:
        raise Invalid(f"a volume's size is at most {_human(cap_bytes)} on this server, not {body.size!r}")
    count = len(session.scalars(select(VolumeRow.id).where(VolumeRow.project_id == queue.id)).all())
    if count >= MAX_PER_PROJECT:
        raise Invalid(f"{body.project!r} has {MAX_PER_PROJECT} volumes already")
    row = VolumeRow(project_id=queue.id, name=body.name, size_bytes=size, created_at=time.time(),
                    created_by=who.name)  # fmt: skip
    session.add(row)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        raise Conflict(f"{body.project!r} already has a volume named {body.name!r}") from None
    return _public(row, body.project)


def list_volumes(session: Session, who: Principal, project: str) -> list[VolumePublic]:
    queue = visible_queue(session, who, project, "project")
    rows = session.scalars(select(VolumeRow).where(VolumeRow.project_id == queue.id).order_by(VolumeRow.name))
    users = _users(session, queue.id)
    return [_public(r, project, users.get(r.name, ())) for r in rows]


def delete(session: Session, who: Principal, project: str, name: str, storage: Storage | None) -> None:
    """The backend takes the volume's storage away (where it made any); the row goes once it has."""
    queue = _writable(session, who, project, name)
    row = session.scalar(select(VolumeRow).where(VolumeRow.project_id == queue.id, VolumeRow.name == name))
    if row is None:
        raise NotFound(f"{project!r} has no volume named {name!r}")
    users = _users(session, queue.id).get(name, [])
    if users:
        raise Conflict(f"volume {name!r} is mounted by {', '.join(sorted(users))}, which have not finished; "
                       "cancel them (or wait for them to end) first")  # fmt: skip
    if storage is not None:
        storage.delete_volume(VolumeSpec(row.id, project, row.name, "/", row.size_bytes))
    session.delete(row)
    session.commit()


def _users(session: Session, project_id: int) -> dict[str, list[str]]:
    """Volume name → the unfinished workloads of the project that mount it."""
    out: dict[str, list[str]] = {}
    query = select(WorkloadRow.name, WorkloadRow.spec).where(
        WorkloadRow.project_id == project_id,
        WorkloadRow.state.not_in([p.value for p in TERMINAL]),
        WorkloadRow.deleted_at.is_(None),
    )
    for wname, spec in session.execute(query):
        for mount in mounts_of(spec):
            out.setdefault(mount.name, []).append(wname)
    return out


def mounts_of(spec: dict[str, object] | None) -> list[VolumeMount]:
    """The volumes a stored spec mounts."""
    raw = (spec or {}).get("volumes") or []
    return [VolumeMount.model_validate(m) for m in raw] if isinstance(raw, list) else []


def check_mounts(session: Session, project_id: int, project: str, mounts: Sequence[VolumeMount]) -> None:
    """At submit: every volume named exists in the project, and each path is one a volume may take."""
    paths: list[str] = []
    names = set(session.scalars(select(VolumeRow.name).where(VolumeRow.project_id == project_id)))
    for m in mounts:
        if m.name not in names:
            raise Invalid(f"volume {m.name!r} not found in project {project!r}: create it first "
                          f"(gpupool volume create {m.name} --size 50GiB -p {project})")  # fmt: skip
        why = path_refused(m.path)
        if why is None and clashes_with_workdir(m.path, POD_WORKDIR):
            why = f"it clashes with the working directory ({POD_WORKDIR} in a pod)"
        if why is not None:
            raise Invalid(f"volume {m.name!r} cannot be mounted at {m.path!r}: {why}")
        for other in paths:
            if _nested(other, m.path):
                raise Invalid(f"volume {m.name!r} at {m.path!r} clashes with another mount at {other!r}")
        paths.append(m.path)


def path_refused(path: str) -> str | None:
    if not path.startswith("/"):
        return "the path must be absolute"
    if posixpath.normpath(path) != path or "//" in path or any(p in (".", "..") for p in path.split("/")):
        return "the path must be normalised (no '.', '..', repeated or trailing '/')"
    if path == "/":
        return "not the root"
    for reserved in RESERVED_PATHS:
        if _nested(reserved, path):
            return f"{reserved} belongs to the system or the sandbox"
    return None


def clashes_with_workdir(path: str, workdir: str) -> bool:
    """Whether a mount at `path` would hide the workload's working directory or sit inside it."""
    return _nested(path, workdir)


def _nested(a: str, b: str) -> bool:
    return a == b or b.startswith(a.rstrip("/") + "/") or a.startswith(b.rstrip("/") + "/")


def _human(n: int) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n} bytes"
