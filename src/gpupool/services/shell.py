"""Who may open a shell (exec, attach, port-forward) into which running member, and the audit record of each
session. The rules are cancel's: the project's members and admins; its viewers get 403; callers outside it get
404, as for a workload that does not exist."""

from __future__ import annotations

import shlex
import time
import uuid

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.backends.shell import ShellTarget
from gpupool.lifecycle.phases import STARTED, Phase
from gpupool.services import audit
from gpupool.services.auth import Principal
from gpupool.services.errors import Conflict, Forbidden, Invalid, NotFound
from gpupool.services.workloads import find
from gpupool.store.tables import AllocationRow, QueueRow

MAX_ARGV = 256
MAX_ARGV_BYTES = 64 * 1024


def resolve(session: Session, who: Principal, ref: str, project: str | None, rank: int) -> ShellTarget:
    """The running member `rank` of workload `ref`, for a caller who may act on it."""
    row = find(session, who, ref, project)
    if not who.can_write(row.project_id):
        raise Forbidden("a project's viewers cannot open shells into its workloads; its members can")
    if row.state != Phase.RUNNING:
        raise Conflict(f"{row.name!r} is {row.state}: shells open into running workloads only")
    alloc = session.scalar(
        select(AllocationRow)
        .where(AllocationRow.workload_id == row.id, AllocationRow.attempt == row.attempt)
        .where(AllocationRow.member == rank, AllocationRow.state.in_(sorted(STARTED)))
    )
    if alloc is None:
        raise NotFound(f"{row.name!r} has no running member of rank {rank}")
    queue = session.get(QueueRow, row.project_id)
    return ShellTarget(row.id, row.name, queue.name if queue else "", row.project_id, alloc.id, rank, row.type)


def check_argv(argv: list[str]) -> list[str]:
    if not argv:
        raise Invalid("name a command to run: gpupool exec NAME -- CMD [ARGS...]")
    if len(argv) > MAX_ARGV or sum(len(a.encode()) for a in argv) > MAX_ARGV_BYTES:
        raise Invalid(f"the command is too long (at most {MAX_ARGV} words, {MAX_ARGV_BYTES} bytes)")
    if any("\0" in a for a in argv):
        raise Invalid("a command's words cannot hold NUL characters")
    return argv


def describe(kind: str, rank: int, argv: list[str] | None = None, port: int | None = None) -> str:
    """The audit action of a session: its kind, the member, and the command or port."""
    what = shlex.join(argv) if argv else (f"port {port}" if port is not None else "")
    return f"{kind} rank {rank}" + (f": {what}" if what else "")


def record(
    session: Session,
    who: Principal,
    ref: str,
    target: ShellTarget | None,
    action: str,
    status: int,
    address: str | None,
) -> None:
    """One audit record for one session, opened (101) or refused (its status)."""
    note = audit.Note(tenant=target.project if target else None, obj=f"workload/{target.workload if target else ref}")
    entry = audit.Entry(str(uuid.uuid4()), action, f"workload/{ref}", status, address, who, note)
    audit.record(session, entry, time.time())
