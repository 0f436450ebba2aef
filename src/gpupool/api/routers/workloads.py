from __future__ import annotations

from functools import partial
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse
from sqlalchemy.orm import Session

from gpupool.api.deps import Context, ContextDep, CurrentUser, SessionDep, no_store
from gpupool.api.errors import ERRORS
from gpupool.models.attempts import ApplyResult
from gpupool.models.schemas import Page, UsageReport, WorkloadCreate, WorkloadDetail, WorkloadPublic
from gpupool.models.wire import INT32_MAX, INT64_MAX, NO_NUL, UNIX_MAX, UNIX_MIN, WorkloadState
from gpupool.services import apps, logs, reports, reruns, workloads
from gpupool.services.apps import SESSION_COOKIE
from gpupool.services.auth import Principal
from gpupool.services.errors import Invalid

router = APIRouter(tags=["workloads"], responses=ERRORS)
ProjectQ = Annotated[str | None, Query(max_length=63)]
UnixQ = Annotated[float | None, Query(description="Unix seconds", ge=UNIX_MIN, le=UNIX_MAX, allow_inf_nan=False)]


@router.post("/workloads", response_model=WorkloadPublic, status_code=201)
async def submit_workload(
    body: WorkloadCreate,
    response: Response,
    session: SessionDep,
    ctx: ContextDep,
    who: CurrentUser,
    idempotency_key: Annotated[str | None, Header()] = None,
) -> WorkloadPublic:
    overrides = ctx.settings.min_runtime_s or {}
    out, created = await run_in_threadpool(
        workloads.submit,
        session,
        who,
        body,
        default_grace_s=ctx.settings.grace_s,
        min_runtime_s=overrides,
        notebooks=ctx.backend.capabilities().notebooks,
        idempotency_key=idempotency_key,
        allowed_images=ctx.settings.allowed_images,
    )
    if created:
        ctx.controller.wake()
    else:
        response.status_code = 200
    return out


@router.get("/workloads", response_model=Page[WorkloadPublic])
def list_workloads(
    session: SessionDep,
    who: CurrentUser,
    project: ProjectQ = None,
    state: Annotated[
        list[WorkloadState] | None, Query(max_length=len(WorkloadState), description="In any of these (repeatable)")
    ] = None,
    user: Annotated[str | None, Query(max_length=63, pattern=NO_NUL, description="Submitted by this user")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=32, description="Newest first, before this id")] = None,
    after: Annotated[int | None, Query(ge=0, le=INT32_MAX, description="Oldest first, after this id")] = None,
    all_runs: Annotated[bool, Query(description="Every run of each name, not its newest only")] = False,
) -> Page[WorkloadPublic]:
    """A name once, as its newest run (with `run` and `runs`), unless all_runs."""
    return workloads.list_workloads(
        session, who, project=project, state=state, user=user, limit=limit, cursor=cursor, after=after,
        all_runs=all_runs,
    )  # fmt: skip


@router.get("/workloads/{ref}", response_model=WorkloadDetail, dependencies=[Depends(no_store)])
def describe_workload(
    ref: str, session: SessionDep, ctx: ContextDep, who: CurrentUser, project: ProjectQ = None
) -> WorkloadDetail:
    isolation = {**ctx.backend.capabilities().isolation, **apps.isolation(ctx.settings)}
    return workloads.describe(session, who, ref, project, apps.apps_base_url(ctx.settings), isolation)


@router.post("/workloads/{ref}/cancel", response_model=WorkloadPublic)
def cancel_workload(
    ref: str, session: SessionDep, ctx: ContextDep, who: CurrentUser, project: ProjectQ = None
) -> WorkloadPublic:
    out = workloads.cancel(session, who, ref, project)  # never waits for a cycle: see workloads._write
    ctx.controller.wake()
    return out


@router.post("/workloads/{ref}/resume", response_model=WorkloadPublic)
def resume_workload(
    ref: str, session: SessionDep, ctx: ContextDep, who: CurrentUser, project: ProjectQ = None
) -> WorkloadPublic:
    out = workloads.resume(session, who, ref, project)  # never waits for a cycle: see workloads._write
    ctx.controller.wake()
    return out


def _submitter(session: Session, ctx: Context, who: Principal) -> reruns.Submit:
    return partial(
        workloads.submit, session, who, default_grace_s=ctx.settings.grace_s,
        min_runtime_s=ctx.settings.min_runtime_s or {}, notebooks=ctx.backend.capabilities().notebooks,
        allowed_images=ctx.settings.allowed_images,
    )  # fmt: skip


@router.post("/workloads/{ref}/rerun", response_model=WorkloadPublic, status_code=201)
def rerun_workload(
    ref: str, session: SessionDep, ctx: ContextDep, who: CurrentUser, project: ProjectQ = None
) -> WorkloadPublic:
    """A finished workload's spec again, under its name: a new workload; the old one stays as its history."""
    out = reruns.rerun(session, who, ref, project, _submitter(session, ctx, who))
    ctx.controller.wake()
    return out


@router.delete("/workloads/{ref}", response_model=dict[str, list[int]])
def delete_workload(
    ref: str, session: SessionDep, ctx: ContextDep, who: CurrentUser, project: ProjectQ = None
) -> dict[str, list[int]]:
    """A finished workload and the earlier ones of its name, with their files; 409 while one of its name lives."""
    ids = reruns.delete(session, who, ref, project)
    storage = ctx.backend.capabilities().storage  # a backend that keeps files for workloads removes them
    if storage is not None:
        for wid in ids:
            storage.discard(wid)
    return {"deleted": ids}


@router.put(
    "/workloads/{name}", response_model=ApplyResult,
    responses={201: {"model": ApplyResult, "description": "Submitted (no workload of this name lived)."}},
)  # fmt: skip
def apply_workload(
    name: str,
    body: WorkloadCreate,
    response: Response,
    session: SessionDep,
    ctx: ContextDep,
    who: CurrentUser,
    project: ProjectQ = None,
    force: bool = False,
) -> ApplyResult | JSONResponse:
    """Declarative: 200 `unchanged` when the live workload of this name has this spec (nothing written); 201 when
    none lives (a finished one's name runs again); 409 naming what differs unless `force`, which cancels the live
    one (within its grace period) and submits this spec under its name."""
    try:
        out = reruns.apply(session, who, name, project, body, force, _submitter(session, ctx, who))
    except reruns.SpecDiffers as e:
        return JSONResponse({"detail": e.message, "differs": e.differs}, status_code=409)
    if out.created:
        response.status_code = 201
        ctx.controller.wake()
    return out


@router.get("/reports/usage", response_model=UsageReport)
def usage_report(
    session: SessionDep,
    ctx: ContextDep,
    who: CurrentUser,
    start: UnixQ = None,
    end: UnixQ = None,
    by: Annotated[str, Query(pattern="^(department|project|user|workload)$")] = "project",
) -> UsageReport:
    """Usage and cost from `start` (default: a day before `end`) to `end` (default: now)."""
    return reports.usage(session, who, start, end, by, ctx.settings.prices, ctx.controller.clock())


@router.get("/workloads/{ref}/logs", response_class=Response)
async def workload_logs(
    request: Request,
    ref: str,
    session: SessionDep,
    ctx: ContextDep,
    who: CurrentUser,
    project: ProjectQ = None,
    rank: Annotated[int, Query(ge=0, le=1024)] = 0,
    offset: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
    limit: Annotated[int, Query(ge=1, le=4 * 1024 * 1024)] = 1024 * 1024,
    follow: Annotated[bool, Query(description="Stream the log as it is written until the workload ends.")] = False,
) -> Response:
    """Bytes of a member's log from `offset`; X-Next-Offset says where to continue, X-Workload-State whether
    more may come. With follow, one streamed answer carries everything from `offset` to the end."""
    row = await run_in_threadpool(workloads.find, session, who, ref, project)
    if rank >= row.workers:
        raise Invalid(f"{row.name!r} has {row.workers} member(s); rank {rank} does not exist")
    if follow:
        # The credential this request came with (bearer, or the portal's session cookie), checked again as it goes.
        scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
        token = bearer.strip() if scheme.lower() == "bearer" else request.cookies.get(SESSION_COOKIE, "")
        project_id = row.project_id

        def allowed() -> bool:
            with ctx.sessions() as s:
                now = ctx.principals.get(s, token)
                return now is not None and now.can_read(project_id)

        recheck = ctx.settings.app_recheck_s
        stream = logs.follow(ctx.sessions, ctx.backend, row.id, rank, offset, allowed=allowed, recheck_s=recheck)
        return StreamingResponse(
            stream, media_type="text/plain; charset=utf-8", headers={"X-Workload-State": row.state}
        )
    data = await run_in_threadpool(ctx.backend.read_log, row.id, rank, offset, limit)
    headers = {"X-Next-Offset": str(offset + len(data)), "X-Workload-State": row.state}
    return Response(data, media_type="text/plain; charset=utf-8", headers=headers)
