"""Submitting, listing, describing and cancelling workloads."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.control.policies import Policy, chains, effective
from gpupool.core.priority import DEFAULT_CLASSES, PriorityClass
from gpupool.lifecycle import transitions as lifecycle
from gpupool.lifecycle.phases import TERMINAL, Phase
from gpupool.models import imageref
from gpupool.models.attempts import AttemptPublic, HistoryItem
from gpupool.models.clusters import CLUSTER_LOST_AFTER_S
from gpupool.models.schemas import Page, WorkloadCreate, WorkloadDetail, WorkloadPublic
from gpupool.models.wire import DNS_LABEL, INT32_MAX
from gpupool.services import audit, code, reasons, rightsizing, runs, volumes
from gpupool.services.auth import Principal, principal_for
from gpupool.services.errors import Conflict, Forbidden, Invalid, NotFound
from gpupool.services.org import queue_named
from gpupool.services.requests import check_fits, check_text, priority_of, to_request
from gpupool.services.views import workload_detail, workload_public
from gpupool.store import changes
from gpupool.store.tables import ClusterRow, EventRow, NodeRow, QueueRow, UserRow, WorkloadRow

_ID = re.compile(r"^[0-9]{1,10}$", re.ASCII)  # ids are the store's 32-bit Integer; \d alone takes "١٢٣"
_NAME = re.compile(DNS_LABEL)


def _id_or_none(text: str) -> int | None:
    """An id written in ASCII digits that the store can hold; None when `text` is not one."""
    return int(text) if _ID.match(text) and int(text) <= INT32_MAX else None


def _chain(session: Session, project: QueueRow) -> list[QueueRow]:
    return chains(list(session.scalars(select(QueueRow))))[project.id]


def submit(
    session: Session,
    who: Principal,
    body: WorkloadCreate,
    *,
    default_grace_s: float,
    min_runtime_s: dict[str, float],
    notebooks: bool,
    idempotency_key: str | None = None,
    classes: Sequence[PriorityClass] = DEFAULT_CLASSES,
    allowed_images: Sequence[str] = ("*",),
) -> tuple[WorkloadPublic, bool]:
    """Validate and queue a workload. Returns it and whether it was created (False: an idempotent replay).
    `allowed_images`: the server's patterns of the images a workload may name."""
    # The whole organisation tree in two queries (queues, then their quotas): it is small, and a submit
    # needs the project and every ancestor.
    queues = list(session.scalars(select(QueueRow)))
    audit.note(tenant=body.project, obj=f"workload/{body.name or '(generated)'}")
    project = next((q for q in queues if q.name == body.project and q.kind == "project"), None)
    if project is None or not who.can_read(project.id):
        raise NotFound(f"no project named {body.project!r}")
    if not who.can_write(project.id):
        raise Forbidden(f"your role ({who.role}) cannot submit to {body.project!r}")
    if idempotency_key is not None:
        if len(idempotency_key) > 128:
            raise Invalid("Idempotency-Key is longer than 128 characters")
        prior = session.scalar(
            select(WorkloadRow).where(WorkloadRow.owner_id == who.id, WorkloadRow.idempotency_key == idempotency_key)
        )
        if prior is not None:
            return _replay(session, who, prior, idempotency_key), False
    tracking = body.mlflow_uri or project.mlflow_uri
    if body.model is not None:
        _check_model(body, tracking)
    check_text(body)
    if body.image is not None and not imageref.allowed(body.image, allowed_images):
        raise Invalid(f"image {body.image!r} is not one this server allows (its patterns: "
                      f"{', '.join(allowed_images)}); ask an admin to allow it (allowed_images)")  # fmt: skip
    if body.type == "notebook" and not notebooks:
        raise Invalid("notebooks need JupyterLab on the server: install gpupool[apps]")
    request = to_request(body)
    klass = priority_of(body, classes)
    if klass.name == "production" and not (project.production_allowed or who.manages_project(project.id)):
        raise Forbidden(
            f"project {body.project!r} does not allow production priority for members; choose another "
            "--priority, or ask an admin to allow it (gpupool project set NAME --production-allowed)"
        )
    preemptible = klass.preemptible if body.preemptible is None else body.preemptible
    code.check_submitted(session, project.id, project.name, body.code)
    volumes.check_mounts(session, project.id, project.name, body.volumes)
    nodes = session.scalars(select(NodeRow).order_by(NodeRow.name)).all()
    fleet = session.scalars(select(ClusterRow.name)).all()
    check_fits(
        request, body.workers, body.pools, preemptible, nodes, chains(queues)[project.id], body.gpu_models,
        body.clusters, fleet,
    )  # fmt: skip
    name = body.name or f"{body.type}-{secrets.token_hex(3)}"
    now = time.time()
    row = WorkloadRow(
        name=name,
        project_id=project.id,
        owner_id=who.id,
        idempotency_key=idempotency_key,
        type=body.type,
        priority_class=klass.name,
        priority=klass.value,
        preemptible=preemptible,
        min_runtime_s=min_runtime_s.get(klass.name, klass.min_runtime_s),
        gpus=request.gpus,
        gpu_milli=request.gpu_milli,
        gpu_memory_mib=request.gpu_memory_mib,
        cpu_milli=request.cpu_milli,
        memory_mib=request.memory_mib,
        workers=body.workers,
        pools=list(body.pools),
        gpu_models=list(body.gpu_models),
        clusters=list(body.clusters),
        cluster_lost_after_s=cluster_lost_after(body),
        mlflow=_tracking(tracking, body.model),
        command=list(body.command),
        image=body.image,
        code=body.code,
        env=dict(body.env),
        spec=spec_of(body),
        spec_hash=spec_hash(spec_of(body)),
        retry=body.retry.model_dump(mode="json") if body.retry is not None else None,
        attempts=[],
        live_name=name,
        port=MODEL_PORT if body.model is not None and body.port is None else body.port,
        grace_s=default_grace_s if body.grace_s is None else body.grace_s,
        max_duration_s=body.max_duration_s,
        app_token=secrets.token_urlsafe(24) if body.type == "notebook" else None,
        state=Phase.PENDING.value,
        attempt=0,
        nominated=[],
        created_at=now,
        queued_at=now,
        allocations=[],
    )
    session.add(row)
    try:
        session.flush()
    except IntegrityError:
        session.rollback()
        if idempotency_key is not None:
            # A retry that raced the original (the client gave up waiting; both got in): the first one's
            # commit holds the key, and this one is its replay, not a clash of names.
            prior = session.scalar(
                select(WorkloadRow).where(
                    WorkloadRow.owner_id == who.id, WorkloadRow.idempotency_key == idempotency_key
                )
            )
            if prior is not None:
                return _replay(session, who, prior, idempotency_key), False
        # Among live workloads: a finished one's name is free (live_name).
        raise Conflict(f"project {body.project!r} already has a workload named {name!r}") from None
    _still_allowed(session, who, project, body.project)
    session.add(lifecycle.submitted(row, who.name, now))
    session.commit()
    return _publics(session, [row])[0], True


def _still_allowed(session: Session, who: Principal, project: QueueRow, name: str) -> None:
    """Inside the submit's write, after its row is written: the submitter is still not offboarded and still may
    write to the project, as the store says now, not as a principal cached a few seconds ago says. Offboarding
    takes the user's row for update before it cancels the user's work, and this waits on that row (SQLite: its
    one writer): so a submit either lands before the offboarding, which then cancels it, or sees it and is
    refused. Never both missed."""
    user = session.scalar(select(UserRow).where(UserRow.id == who.id).with_for_update(read=True))
    if user is None or user.disabled_at is not None:
        session.rollback()
        raise Forbidden(f"{who.name!r} is disabled: it can submit nothing")
    if not principal_for(session, user).can_write(project.id):
        session.rollback()
        raise NotFound(f"no project named {name!r}")


def spec_of(body: WorkloadCreate) -> dict[str, Any]:
    """What was asked, as JSON, without its name and project: fields left at their defaults are left out, so a
    field a later release adds (with a default) changes no stored spec's hash."""
    return body.model_dump(mode="json", exclude={"name", "project"}, exclude_defaults=True)


def spec_hash(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _replay(session: Session, who: Principal, prior: WorkloadRow, key: str) -> WorkloadPublic:
    """The workload an Idempotency-Key already made, named by its own project (a replay may name another, or a
    typo of it); refused, without a word of what it made, where the caller may not read that project now (a token
    narrowed to another project, a workload's, or its owner since taken out of it)."""
    if not who.can_read(prior.project_id):
        raise Conflict(f"Idempotency-Key {key[:40]!r} was sent with another of your submissions: a key names one")
    return _publics(session, [prior])[0]


def find(session: Session, who: Principal, ref: str, project: str | None = None) -> WorkloadRow:
    """A workload by name (or numeric id) among the projects the caller may read; others' are not found. A name
    finished workloads had before names the newest of them (or the live one)."""
    query = select(WorkloadRow).where(WorkloadRow.deleted_at.is_(None))
    if project is not None:
        p = session.scalar(select(QueueRow).where(QueueRow.name == project, QueueRow.kind == "project"))
        if p is None or not who.can_read(p.id):
            raise NotFound(f"no project named {project!r}")
        query = query.where(WorkloadRow.project_id == p.id)
    run: int | None = None
    named, _, number = ref.partition("#")
    if ref.isascii() and ref.isdigit():
        wid = _id_or_none(ref)
        if wid is None:
            raise Invalid(f"workload id {ref[:24]!r} is out of range: ids go up to {INT32_MAX}")
        query = query.where(WorkloadRow.id == wid)
    elif _NAME.fullmatch(named.strip()) and (not number or (number.isascii() and number.strip().isdigit())):
        query = query.where(WorkloadRow.name == named.strip())
        run = int(number) if number else None  # NAME#N: its Nth run, as `list --all-runs` shows it
    else:
        raise Invalid(f"{ref[:80]!r} is neither a workload id (ASCII digits), a workload name (a DNS label) nor "
                      "a run of one (NAME#N)")  # fmt: skip
    newest: dict[int, WorkloadRow] = {}
    seen: dict[int, int] = {}
    for r in session.scalars(query.order_by(WorkloadRow.id)):
        if who.can_read(r.project_id):
            seen[r.project_id] = seen.get(r.project_id, 0) + 1
            if run is None or seen[r.project_id] == run:
                newest[r.project_id] = r
    if run is not None and not newest:
        raise NotFound(f"{named.strip()!r} has no run {run}" if seen else f"no workload named {named.strip()!r}")
    rows = list(newest.values())
    if not rows:
        raise NotFound(f"no workload named {ref!r}")
    if len(rows) > 1:
        raise Conflict(f"several projects have a workload named {ref!r}; name the project")
    owner = session.get(QueueRow, rows[0].project_id)
    audit.note(tenant=owner.name if owner else None, obj=f"workload/{rows[0].name}")
    return rows[0]


def _project_names(session: Session) -> dict[int, str]:
    return {q.id: q.name for q in session.scalars(select(QueueRow).where(QueueRow.kind == "project"))}


def _owners(session: Session, rows: Sequence[WorkloadRow]) -> list[str]:
    """The names of the users who submitted these workloads, in their order (one query)."""
    ids = sorted({r.owner_id for r in rows})
    found = session.execute(select(UserRow.id, UserRow.name).where(UserRow.id.in_(ids)))
    names: dict[int, str] = {i: n for i, n in found}
    return [names.get(r.owner_id, "?") for r in rows]


def list_workloads(
    session: Session,
    who: Principal,
    *,
    project: str | None = None,
    state: str | Sequence[str] | None = None,
    user: str | None = None,
    limit: int = 100,
    cursor: str | None = None,
    after: int | None = None,
    all_runs: bool = False,
) -> Page[WorkloadPublic]:
    """Newest first, from `cursor` on (the page before gave it); or, with `after`, oldest first from the id after
    it. Either way a page is one index range read (ids, within a project or a state where one is asked), however
    many workloads come before it; next_cursor is what to pass for the next page (as `cursor`, or as `after`).
    A name is listed once, as its newest run (its state is that run's), unless `all_runs`; each item says its run
    number and how many runs its name has had."""
    if cursor is not None and after is not None:
        raise Invalid("cursor pages newest first and after oldest first: give one of them")
    names = _project_names(session)
    ascending = after is not None
    query = (
        select(WorkloadRow)
        .where(WorkloadRow.deleted_at.is_(None))
        .order_by(WorkloadRow.id if ascending else WorkloadRow.id.desc())
        .limit(limit + 1)
    )
    if project is not None:
        p = queue_named(session, project, "project")
        if not who.can_read(p.id):
            raise NotFound(f"no project named {project!r}")
        query = query.where(WorkloadRow.project_id == p.id)
    elif not who.is_admin:
        query = query.where(WorkloadRow.project_id.in_(sorted(who.project_ids)))
    states = [state] if isinstance(state, str) else sorted(set(state or ()))
    if states:  # one state is the (state, id) index's range, as before; several, an IN over it
        query = query.where(WorkloadRow.state == states[0] if len(states) == 1 else WorkloadRow.state.in_(states))
    if user is not None:
        # An unknown name lists nothing, as a known one with no workloads here does: which names exist in other
        # tenants is not the caller's to learn.
        owner = session.scalar(select(UserRow.id).where(UserRow.name == user))
        query = query.where(WorkloadRow.owner_id == (owner if owner is not None else -1))
    if cursor is not None:
        before = _id_or_none(cursor)
        if before is None:
            raise Invalid("cursor is not one this server handed out")
        query = query.where(WorkloadRow.id < before)
    if after is not None:
        query = query.where(WorkloadRow.id > after)
    if not all_runs:
        query = runs.newest_only(query)
    rows = list(session.scalars(query))
    more = len(rows) > limit
    rows = rows[:limit]
    items = _publics(session, rows, names)
    return Page[WorkloadPublic](items=items, next_cursor=str(rows[-1].id) if more and rows else None)


def _publics(
    session: Session, rows: Sequence[WorkloadRow], names: dict[int, str] | None = None
) -> list[WorkloadPublic]:
    """The wire form of `rows`, each with its owner's name and its run among its name's runs (two queries)."""
    names = _project_names(session) if names is None else names
    numbers = runs.numbers(session, rows)
    return [
        workload_public(r, names.get(r.project_id, "?"), o).model_copy(
            update={"run": numbers[r.id][0], "runs": numbers[r.id][1]}
        )
        for r, o in zip(rows, _owners(session, rows), strict=True)
    ]


def describe(
    session: Session, who: Principal, ref: str, project: str | None, public_url: str, isolation: dict[str, str]
) -> WorkloadDetail:
    row = find(session, who, ref, project)
    names = _project_names(session)
    events = session.scalars(select(EventRow).where(EventRow.workload_id == row.id).order_by(EventRow.id)).all()
    queue = session.get(QueueRow, row.project_id)
    policy = effective(_chain(session, queue)) if queue is not None else Policy()
    project_name = names.get(row.project_id, "?")
    if queue is not None and queue.host_network and "network" in isolation:
        isolation = {**isolation, "network": f"the host's: an admin granted {project_name} the host network"}
    detail = workload_detail(
        row, project_name, events, policy, public_url=public_url, isolation=isolation,
        position=reasons.position(session, row), rightsizing=rightsizing.advice_for(session, row),
        owner=_owners(session, [row])[0],
    )  # fmt: skip
    run, count = runs.numbers(session, [row])[row.id]
    detail = detail.model_copy(
        update={"attempts": attempts_of(row), "history": history_of(session, row), "run": run, "runs": count}
    )
    if row.code is None:
        return detail
    tree = code.manifest_row(session, row.project_id, row.code)
    sizes = {"code_files": tree.files, "code_bytes": tree.size} if tree is not None else {}
    return detail.model_copy(update={"code": row.code, **sizes})


def attempts_of(row: WorkloadRow) -> list[AttemptPublic]:
    """Its ended attempts as recorded when each ended, then the one under way (or waiting to be), if any."""
    out = [AttemptPublic.model_validate(a) for a in row.attempts or []]
    if row.state not in TERMINAL and row.started_at is not None:
        out.append(AttemptPublic(number=row.attempt + 1, started=row.started_at, ended=None, outcome=row.state))
    return out


def history_of(session: Session, row: WorkloadRow) -> list[HistoryItem]:
    """Earlier workloads of its name in its project, oldest first."""
    query = select(WorkloadRow).where(
        WorkloadRow.project_id == row.project_id, WorkloadRow.name == row.name, WorkloadRow.id < row.id,
        WorkloadRow.deleted_at.is_(None),
    ).order_by(WorkloadRow.id)  # fmt: skip
    return [
        HistoryItem(
            id=r.id,
            state=r.state,
            attempts=len(r.attempts or []),
            created_at=r.created_at,
            finished_at=r.finished_at,
            exit_code=r.exit_code,
        )
        for r in session.scalars(query)
    ]


def resume(session: Session, who: Principal, ref: str, project: str | None) -> WorkloadPublic:
    """A workload a policy suspended goes back in the queue, in its old place."""

    def change(row: WorkloadRow) -> EventRow | None:
        if not who.can_write(row.project_id):
            raise Forbidden(f"your role ({who.role}) cannot resume workloads")
        if row.state != Phase.SUSPENDED or not row.hold:
            raise Conflict(f"{row.name!r} is {row.state}; only a workload suspended by a policy can be resumed")
        return lifecycle.resume(row, who.name, time.time())

    return _write(session, who, ref, project, change)


def cancel(session: Session, who: Principal, ref: str, project: str | None) -> WorkloadPublic:
    """Pending work ends at once; running work is asked to stop and ends when its processes are gone."""

    def change(row: WorkloadRow) -> EventRow | None:
        if not who.can_write(row.project_id):
            raise Forbidden(f"your role ({who.role}) cannot cancel workloads")
        if row.state in TERMINAL:
            raise Conflict(f"{row.name!r} has already ended ({row.state})")
        return lifecycle.cancel(row, who.name, time.time())

    return _write(session, who, ref, project, change)


WRITE_TRIES = 5


def _write(
    session: Session, who: Principal, ref: str, project: str | None, change: Callable[[WorkloadRow], EventRow | None]
) -> WorkloadPublic:
    """Reads a workload, changes it and commits, unless a scheduling cycle wrote it in between (it commits
    without waiting for anyone): then reads it again and decides again. A cycle never waits for this either; it
    leaves a row written since it read it to its next cycle."""
    for _ in range(WRITE_TRIES):
        row = find(session, who, ref, project)
        event = change(row)
        with session.no_autoflush:
            if event is not None:
                session.add(event)
            if not changes.claim(session, {row.id: row.version}):
                session.rollback()
                continue
        session.commit()
        return _publics(session, [row])[0]
    raise Conflict(f"{ref!r} kept changing while this request was made; try again")


def cluster_lost_after(body: WorkloadCreate) -> float | None:
    """How long its cluster may be down before it is requeued elsewhere; None: it waits. Notebooks wait by default
    (their files are on that cluster); the rest go after MultiKueue's 15 minutes."""
    policy = body.on_cluster_lost
    if policy is None:
        return None if body.type == "notebook" else CLUSTER_LOST_AFTER_S
    return None if policy.action == "wait" else policy.after_s


MODEL_PORT = 8080
"""Where a model server listens unless its workload names a port."""


def _check_model(body: WorkloadCreate, tracking: str | None) -> None:
    if body.type != "inference":
        raise Invalid(f"--model serves a model: it goes with --type inference, not {body.type}")
    if body.command:
        raise Invalid("--model runs MLflow's model server: leave out the command")
    if body.image is not None:
        raise Invalid("--model runs MLflow's model server as the server's settings name it: leave out --image")
    if tracking is None:
        raise Invalid("--model needs an MLflow tracking server: --mlflow URL, or `gpupool project set --mlflow-uri`")


def _tracking(uri: str | None, model: str | None) -> dict[str, Any] | None:
    """The row's MLflow: its tracking server, and the model it serves (a served model makes no run)."""
    if uri is None:
        return None
    return {"uri": uri.rstrip("/")} | ({"model": model} if model is not None else {})
