"""Who may reach a workload's app (a notebook or an inference service) through the server's proxy, and where."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.lifecycle.phases import STARTED, Phase
from gpupool.services.auth import Principal
from gpupool.services.errors import Forbidden, NotFound, ServiceError
from gpupool.store.tables import AllocationRow, QueueRow, WorkloadRow

APP_TYPES = ("notebook", "inference")
SESSION_COOKIE = "gpupool_session"
"""The portal's session, for the browser's requests to /apps/ (HttpOnly; the API itself reads only bearer
tokens, so the cookie cannot be used to call it from a page)."""


class NotRunning(ServiceError):
    status = 503


@dataclass(frozen=True, slots=True)
class AppTarget:
    workload_id: int
    kind: str
    alloc_id: str
    port: int | None
    prefix: str
    """The public path the app lives under; notebooks are told it, services see paths below it."""
    app_token: str | None
    """A notebook's own token, which the proxy presents for the callers it has authenticated."""


def resolve(session: Session, who: Principal | None, project: str, name: str) -> AppTarget:
    """The app `name` of `project`, for a caller who may use it: its project's members and admins. Viewers get
    403; callers outside the project, and names that are not apps, get 404 (no hint that they exist). `who`
    None: the caller holds an API key made for this service (checked by `tokens.apikey_opens`)."""
    queue = session.scalar(select(QueueRow).where(QueueRow.name == project, QueueRow.kind == "project"))
    if queue is None or (who is not None and not who.can_read(queue.id)):
        raise NotFound(f"no app {project}/{name}")
    # The live workload of that name: a name is unique among live workloads only (finished ones keep it too).
    row = session.scalar(select(WorkloadRow).where(WorkloadRow.project_id == queue.id, WorkloadRow.live_name == name))
    if row is None or row.type not in APP_TYPES or (who is None and row.type != "inference"):
        raise NotFound(f"no app {project}/{name}")
    if who is not None and not who.can_write(queue.id):
        raise Forbidden(f"your role ({who.role}) cannot open apps of {project!r}")
    alloc = session.scalar(
        select(AllocationRow)
        .where(AllocationRow.workload_id == row.id, AllocationRow.attempt == row.attempt, AllocationRow.member == 0)
        .where(AllocationRow.state.in_(sorted(STARTED)))
    )
    if row.state != Phase.RUNNING or alloc is None:
        raise NotRunning(f"{project}/{name} is {row.state}; it answers once it runs")
    return AppTarget(row.id, row.type, alloc.id, alloc.port, f"/apps/{project}/{name}/", row.app_token)


def still_allowed(session: Session, who: Principal, workload_id: int) -> bool:
    """For open app connections: the caller may still use this workload's app."""
    row = session.get(WorkloadRow, workload_id)
    return row is not None and who.can_write(row.project_id)
