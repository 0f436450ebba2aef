"""A name's life beyond one workload: run a finished one again (rerun), delete one with its files, and apply a
spec declaratively (unchanged: nothing, even once it has finished; changed: refused while it lives unless forced,
which replaces the live one; once it has finished, a new run of the name)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.lifecycle import transitions as lifecycle
from gpupool.lifecycle.phases import TERMINAL
from gpupool.models.attempts import ApplyResult
from gpupool.models.schemas import WorkloadCreate, WorkloadPublic
from gpupool.services import audit, runs
from gpupool.services.auth import Principal
from gpupool.services.errors import Conflict, Forbidden, Invalid, NotFound
from gpupool.services.org import queue_named
from gpupool.services.workloads import WRITE_TRIES, find, spec_hash, spec_of
from gpupool.store import changes
from gpupool.store.tables import QueueRow, WorkloadRow

Submit = Callable[[WorkloadCreate], tuple[WorkloadPublic, bool]]
"""services.workloads.submit with the server's settings, for the caller's session."""


class SpecDiffers(Conflict):
    """An apply of another spec to a live workload, without force: which fields differ, as {field: {old, new}}."""

    def __init__(self, message: str, differs: dict[str, dict[str, Any]]) -> None:
        super().__init__(message)
        self.differs = differs


def _writable(who: Principal, row: WorkloadRow, what: str) -> None:
    if not who.can_write(row.project_id):
        raise Forbidden(f"your role ({who.role}) cannot {what} workloads")


def rerun(session: Session, who: Principal, ref: str, project: str | None, submit: Submit) -> WorkloadPublic:
    """A finished workload's spec submitted again under its name: a new workload, the old one kept as history."""
    row = find(session, who, ref, project)
    _writable(who, row, "rerun")
    if row.state not in TERMINAL:
        raise Conflict(f"{row.name!r} is {row.state}: only a finished workload can be run again")
    if row.spec is None:
        raise Conflict(f"{row.name!r} was submitted before specs were kept: submit it again instead")
    owner = session.get(QueueRow, row.project_id)
    assert owner is not None
    try:
        body = WorkloadCreate.model_validate({**row.spec, "project": owner.name, "name": row.name})
    except ValidationError as e:  # a spec an older release accepted and this one does not
        raise Invalid(f"{row.name!r}'s spec is no longer valid: {e.errors()[0]['msg']}") from None
    out, _ = submit(body)
    return out


def delete(session: Session, who: Principal, ref: str, project: str | None) -> list[int]:
    """Deletes a finished workload and the earlier ones of its name (its history); 409 while one of its name
    lives. Their rows stay for usage reports, out of every list and look-up. The ids, whose files the caller
    then asks its backend to remove."""
    if "#" in ref:
        raise Invalid(f"{ref[:80]!r} names one run: delete removes a name with all its runs (gpupool delete NAME)")
    row = find(session, who, ref, project)
    _writable(who, row, "delete")
    rows = list(
        session.scalars(
            select(WorkloadRow).where(
                WorkloadRow.project_id == row.project_id,
                WorkloadRow.name == row.name,
                WorkloadRow.deleted_at.is_(None),
            )
        )
    )
    live = [r for r in rows if r.state not in TERMINAL]
    if live:
        raise Conflict(f"{row.name!r} is {live[0].state}: cancel it first; only a finished workload can be deleted")
    now = time.time()
    for r in rows:
        r.deleted_at = now
    session.commit()
    return sorted(r.id for r in rows)


def apply(
    session: Session, who: Principal, name: str, project: str | None, body: WorkloadCreate, force: bool, submit: Submit
) -> ApplyResult:
    """The spec `body` under `name`: nothing if the live one, or else the newest run of the name, has this spec
    (finished or not); submitted if no workload of that name lives (a new run, where one finished with another
    spec); refused with what differs from the live one otherwise, unless `force`: then the live one is cancelled
    (stopping within its grace period), its name freed, and this spec submitted, in one commit."""
    if body.name is not None and body.name != name:
        raise Invalid(f"the spec is named {body.name!r}, not {name!r}")
    if project is not None and project != body.project:
        raise Invalid(f"the spec is for project {body.project!r}, not {project!r}")
    body = body.model_copy(update={"name": name})
    audit.note(tenant=body.project, obj=f"workload/{name}")
    queue = queue_named(session, body.project, "project")
    if not who.can_read(queue.id):
        raise NotFound(f"no project named {body.project!r}")
    if not who.can_write(queue.id):
        raise Forbidden(f"your role ({who.role}) cannot apply workloads")
    new = spec_of(body)
    for _ in range(WRITE_TRIES):
        live = session.scalar(
            select(WorkloadRow).where(WorkloadRow.project_id == queue.id, WorkloadRow.live_name == name)
        )
        if live is None:
            last = session.scalar(
                select(WorkloadRow)
                .where(WorkloadRow.project_id == queue.id, WorkloadRow.name == name, WorkloadRow.deleted_at.is_(None))
                .order_by(WorkloadRow.id.desc())
                .limit(1)
            )
            if last is not None and last.spec_hash == spec_hash(new):
                # Declarative: this spec has run under this name, and its outcome stands (a Kubernetes Job applied
                # again stays complete). `rerun` runs it again; another spec is a new run.
                run = runs.numbers(session, [last])[last.id][0]
                return ApplyResult(id=last.id, name=name, project=body.project, state=last.state, unchanged=True,
                                   run=run)  # fmt: skip
            out, _ = submit(body)
            return ApplyResult(id=out.id, name=name, project=body.project, state=out.state, created=True, run=out.run)
        if live.spec_hash == spec_hash(new):
            run = runs.numbers(session, [live])[live.id][0]
            return ApplyResult(id=live.id, name=name, project=body.project, state=live.state, unchanged=True, run=run)
        if not force:
            differs = _differs(live.spec or {}, new)
            listed = "; ".join(f"{k}: {v['old']!r} → {v['new']!r}" for k, v in differs.items())
            raise SpecDiffers(f"{name!r} runs another spec ({listed}); apply with force to replace it", differs)
        replaced = live.id
        with session.no_autoflush:
            event = lifecycle.replace(live, who.name, time.time())
            if event is not None:
                session.add(event)
            if not changes.claim(session, {live.id: live.version}):
                session.rollback()  # a cycle wrote it meanwhile: read it again and decide again
                continue
        try:
            out, _ = submit(body)  # its commit carries the replaced workload's cancel
        except BaseException:
            session.rollback()
            raise
        return ApplyResult(
            id=out.id, name=name, project=body.project, state=out.state, created=True, replaced=replaced, run=out.run
        )
    raise Conflict(f"{name!r} kept changing while this request was made; try again")


def _differs(old: dict[str, Any], new: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Fields whose values differ (a field left at its default is absent: None on that side)."""
    return {
        k: {"old": old.get(k), "new": new.get(k)} for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)
    }
