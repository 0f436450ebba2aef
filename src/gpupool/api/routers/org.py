from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, status

from gpupool.api.deps import Context, ContextDep, CurrentUser, SessionDep, no_store
from gpupool.api.errors import ERRORS
from gpupool.models.accounts import Offboarded, Offboarding, UserCreate, UserCreated, UserPublic
from gpupool.models.schemas import DepartmentCreate, PolicyPublic, PolicyUpdate, ProjectCreate, QueuePublic, QuotaUpdate
from gpupool.models.wire import Name
from gpupool.services import org, policies, users

router = APIRouter(tags=["organisation"], responses=ERRORS)


@router.post("/departments", response_model=QueuePublic, status_code=status.HTTP_201_CREATED)
def create_department(body: DepartmentCreate, session: SessionDep, who: CurrentUser) -> QueuePublic:
    return org.create_department(session, who, body)


@router.get("/departments", response_model=list[QueuePublic])
def list_departments(session: SessionDep, who: CurrentUser) -> list[QueuePublic]:
    return org.list_queues(session, who, "department")


@router.post("/projects", response_model=QueuePublic, status_code=status.HTTP_201_CREATED)
def create_project(body: ProjectCreate, session: SessionDep, ctx: ContextDep, who: CurrentUser) -> QueuePublic:
    out = org.create_project(session, who, body)
    ctx.principals.clear()  # its department's admins may manage it from now on
    return out


@router.get("/projects", response_model=list[QueuePublic])
def list_projects(session: SessionDep, who: CurrentUser) -> list[QueuePublic]:
    return org.list_queues(session, who, "project")


@router.patch("/queues/{name}/quota", response_model=QueuePublic)
def update_quota(name: str, body: QuotaUpdate, session: SessionDep, who: CurrentUser) -> QueuePublic:
    return org.update_quota(session, who, name, body)


@router.get("/queues/{name}/policy", response_model=PolicyPublic)
def get_policy(name: str, session: SessionDep, who: CurrentUser) -> PolicyPublic:
    return policies.get_policy(session, who, name)


@router.patch("/queues/{name}/policy", response_model=PolicyPublic)
def update_policy(name: str, body: PolicyUpdate, session: SessionDep, who: CurrentUser) -> PolicyPublic:
    return policies.update_policy(session, who, name, body)


@router.post(
    "/users", response_model=UserCreated, status_code=status.HTTP_201_CREATED, dependencies=[Depends(no_store)]
)
def create_user(body: UserCreate, session: SessionDep, ctx: ContextDep, who: CurrentUser) -> UserCreated:
    out = org.create_user(session, who, body)
    ctx.principals.clear()
    return out


@router.get("/users", response_model=list[UserPublic])
def list_users(session: SessionDep, who: CurrentUser, deleted: bool = False) -> list[UserPublic]:
    """Deleted users only with `deleted`."""
    return org.list_users(session, who, include_deleted=deleted)


def _offboarded(ctx: Context, out: Offboarded) -> Offboarded:
    ctx.principals.clear()  # what the user holds is refused at once, not after the cache's few seconds
    if out.stopped:
        ctx.controller.wake()
    return out


@router.post("/users/{name}/disable", response_model=Offboarded)
def disable_user(name: Name, body: Offboarding, session: SessionDep, ctx: ContextDep, who: CurrentUser) -> Offboarded:
    """Nothing the user holds signs in (tokens, sessions, apps, its workloads' tokens) until enabled again; its live
    work is cancelled unless keep_work."""
    return _offboarded(ctx, users.disable(session, who, name, body.keep_work))


@router.post("/users/{name}/enable", response_model=Offboarded)
def enable_user(name: Name, session: SessionDep, ctx: ContextDep, who: CurrentUser) -> Offboarded:
    return _offboarded(ctx, users.enable(session, who, name))


@router.delete("/users/{name}", response_model=Offboarded)
def delete_user(
    name: Name,
    session: SessionDep,
    ctx: ContextDep,
    who: CurrentUser,
    keep_work: Annotated[bool, Query(description="Leave the user's live work running")] = False,
) -> Offboarded:
    """Disabled for good: its tokens revoked, out of every project and of the user list; its name stays with its
    workloads and reports. Its live work is cancelled unless keep_work."""
    return _offboarded(ctx, users.delete_user(session, who, name, keep_work))
