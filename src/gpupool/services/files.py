"""A workload's files, for `gpupool cp` and the portal: read by its project's readers, written by its members,
while it runs or after it ended (until its retention is over), through the backend that keeps them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.backends.base import FilesError, FilesTarget, Storage, WorkloadFiles
from gpupool.lifecycle.phases import QUEUED, STARTED, TERMINAL, Phase
from gpupool.models.volumes import FileEntry, FilesPut
from gpupool.services.auth import Principal
from gpupool.services.errors import Conflict, Forbidden, Invalid, NotFound, ServiceError
from gpupool.services.workloads import find
from gpupool.store.tables import AllocationRow, QueueRow, WorkloadRow

MAX_TRANSFER = 512 * 2**20
"""The most one `cp` moves either way (a file, or a directory's tar)."""
T = TypeVar("T")


class Gone(ServiceError):
    status = 410


def _target(
    session: Session, who: Principal, storage: Storage | None, ref: str, project: str | None, rank: int, write: bool,
    retention: float,
) -> WorkloadFiles:  # fmt: skip
    row = find(session, who, ref, project)
    if write and not who.can_write(row.project_id):
        raise Forbidden(f"your role ({who.role}) cannot write the files of {row.name!r}")
    if not 0 <= rank < row.workers:
        raise Invalid(f"{row.name!r} has ranks 0 to {row.workers - 1}, not {rank}")
    if Phase(row.state) in QUEUED and not row.attempts:
        raise Conflict(f"{row.name!r} has not started: it has no files yet")
    alloc = None
    if row.state == Phase.RUNNING:
        alloc = session.scalar(
            select(AllocationRow.id)
            .where(AllocationRow.workload_id == row.id, AllocationRow.attempt == row.attempt)
            .where(AllocationRow.member == rank, AllocationRow.state.in_(sorted(STARTED)))
        )
    if storage is None:
        raise Conflict("this server's backend keeps no files of workloads; write what you need to a volume")
    queue = session.get(QueueRow, row.project_id)
    target = FilesTarget(row.id, row.name, queue.name if queue else "", row.project_id, rank, alloc)
    files = _run(storage.workload_files, target)
    if files is None:
        raise _absent(row, retention, storage.workdir_collected)
    return files


def _absent(row: WorkloadRow, retention: float, collected: Callable[[int], bool]) -> ServiceError:
    if Phase(row.state) in TERMINAL and collected(row.id):
        return Gone(f"the files of {row.name!r} were removed {retention / 86400:g} days after it ended "
                    "(the server's workdir_retention); write what must outlive that to a volume")  # fmt: skip
    return NotFound(f"{row.name!r} has no working directory on this server")


def list_files(session: Session, who: Principal, storage: Storage | None, ref: str, project: str | None, rank: int,
               rel: str, retention: float) -> list[FileEntry]:  # fmt: skip
    files = _target(session, who, storage, ref, project, rank, False, retention)
    return [FileEntry(path=e.path, kind=e.kind, size=e.size, mtime=e.mtime) for e in _run(files.list, rel)]


def read_files(session: Session, who: Principal, storage: Storage | None, ref: str, project: str | None, rank: int,
               rel: str, retention: float) -> tuple[bytes, bool]:  # fmt: skip
    files = _target(session, who, storage, ref, project, rank, False, retention)
    return _run(files.read, rel, MAX_TRANSFER)


def write_files(session: Session, who: Principal, storage: Storage | None, ref: str, project: str | None, rank: int,
                rel: str, data: bytes, retention: float) -> FilesPut:  # fmt: skip
    files = _target(session, who, storage, ref, project, rank, True, retention)
    count, size = _run(files.extract, rel, data, MAX_TRANSFER)
    return FilesPut(files=count, bytes=size)


def _run(fn: Callable[..., T], *args: object) -> T:
    """The backend's refusal (a FilesError: its status and reason) as the service's."""
    try:
        return fn(*args)
    except FilesError as e:
        err = ServiceError(str(e))
        err.status = e.status
        raise err from None
