"""Tokens, memberships, project settings and the audit trail: thin routes over services."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, status

from gpupool.api.deps import ContextDep, CurrentUser, SessionDep, no_store
from gpupool.api.errors import ERRORS
from gpupool.models.access import (
    AuditPublic,
    MemberPublic,
    MemberSet,
    ProjectSettings,
    SecretPublic,
    SecretSet,
    TokenCreate,
    TokenCreated,
    TokenPublic,
)
from gpupool.models.accounts import Offboarded
from gpupool.models.schemas import QueuePublic
from gpupool.models.wire import INT32_MAX, UNIX_MAX, UNIX_MIN, Name
from gpupool.services import audit, members, secrets, tokens

router = APIRouter(tags=["access"], responses=ERRORS)


@router.post(
    "/tokens", response_model=TokenCreated, status_code=status.HTTP_201_CREATED, dependencies=[Depends(no_store)]
)
def create_token(body: TokenCreate, session: SessionDep, ctx: ContextDep, who: CurrentUser) -> TokenCreated:
    audit.note(tenant=body.project, obj=f"token/{body.name}")
    out = tokens.create(session, who, body)
    ctx.principals.clear()
    return out


@router.get("/tokens", response_model=list[TokenPublic])
def list_tokens(session: SessionDep, who: CurrentUser, revoked: bool = False) -> list[TokenPublic]:
    return tokens.list_tokens(session, who, include_revoked=revoked)


@router.delete("/tokens/{token_id}", response_model=TokenPublic)
def revoke_token(
    token_id: Annotated[int, Path(ge=1, le=INT32_MAX)], session: SessionDep, ctx: ContextDep, who: CurrentUser
) -> TokenPublic:
    out = tokens.revoke(session, who, token_id)
    audit.note(tenant=out.project, obj=f"token/{out.id}")
    ctx.principals.clear()
    return out


@router.get("/queues/{name}/members", response_model=list[MemberPublic])
def list_members(name: Name, session: SessionDep, who: CurrentUser) -> list[MemberPublic]:
    return members.list_members(session, who, name)


@router.put("/queues/{name}/members/{user}", response_model=MemberPublic)
def set_member(
    name: Name, user: Name, body: MemberSet, session: SessionDep, ctx: ContextDep, who: CurrentUser
) -> MemberPublic:
    audit.note(tenant=name, obj=f"member/{user}")
    out = members.set_member(session, who, name, user, body.role)
    ctx.principals.clear()
    return out


@router.delete("/queues/{name}/members/{user}", response_model=Offboarded)
def remove_member(
    name: Name,
    user: Name,
    session: SessionDep,
    ctx: ContextDep,
    who: CurrentUser,
    keep_work: Annotated[bool, Query(description="Leave their live work in the project running")] = False,
) -> Offboarded:
    """Their live work in the project is cancelled (unless keep_work); `stopped` names it."""
    audit.note(tenant=name, obj=f"member/{user}")
    out = members.remove_member(session, who, name, user, keep_work)
    ctx.principals.clear()
    if out.stopped:
        ctx.controller.wake()
    return out


@router.patch("/projects/{name}", response_model=QueuePublic)
def update_project(name: Name, body: ProjectSettings, session: SessionDep, who: CurrentUser) -> QueuePublic:
    audit.note(tenant=name, obj=f"project/{name}")
    return members.update_project(session, who, name, body)


SecretName = Annotated[str, Path(max_length=128)]


@router.get("/projects/{name}/secrets", response_model=list[SecretPublic])
def list_secrets(name: Name, session: SessionDep, who: CurrentUser) -> list[SecretPublic]:
    return secrets.list_secrets(session, who, name)


@router.put("/projects/{name}/secrets/{key}", response_model=SecretPublic)
def set_secret(name: Name, key: SecretName, body: SecretSet, session: SessionDep, who: CurrentUser) -> SecretPublic:
    """Every workload of the project started from now on gets it as the environment variable `key`."""
    return secrets.set_secret(session, who, name, key, body.value)


@router.delete("/projects/{name}/secrets/{key}", status_code=204)
def delete_secret(name: Name, key: SecretName, session: SessionDep, who: CurrentUser) -> None:
    secrets.delete_secret(session, who, name, key)


@router.get("/audit", response_model=list[AuditPublic])
def list_audit(
    session: SessionDep,
    who: CurrentUser,
    since: Annotated[float | None, Query(ge=UNIX_MIN, le=UNIX_MAX, allow_inf_nan=False)] = None,
    actor: Annotated[str | None, Query(max_length=63)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> list[AuditPublic]:
    return audit.list_records(session, who, since, actor, limit)
