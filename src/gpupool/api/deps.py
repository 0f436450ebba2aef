"""What every request needs: the app's context, a database session, and the authenticated caller."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from gpupool.backends.base import Backend
from gpupool.control.controller import Controller
from gpupool.services.auth import Principal, authenticate
from gpupool.settings import Settings


@dataclass
class Context:
    settings: Settings
    sessions: sessionmaker[Session]
    backend: Backend
    controller: Controller


def get_context(request: Request) -> Context:
    ctx: Context = request.app.state.ctx
    return ctx


def get_session(ctx: Annotated[Context, Depends(get_context)]) -> Iterator[Session]:
    with ctx.sessions() as session:
        yield session


_bearer = HTTPBearer(auto_error=False)


def get_principal(
    session: Annotated[Session, Depends(get_session)],
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    who = authenticate(session, creds.credentials) if creds is not None else None
    if who is None:
        raise HTTPException(401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"})
    return who


ContextDep = Annotated[Context, Depends(get_context)]
SessionDep = Annotated[Session, Depends(get_session)]
CurrentUser = Annotated[Principal, Depends(get_principal)]
