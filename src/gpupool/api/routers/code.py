"""Code that goes with a job: uploading blobs and manifests, and reading a workload's code back."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials

from gpupool.api.deps import ContextDep, CurrentUser, SessionDep, bearer, get_principal, plausible_token
from gpupool.api.errors import ERRORS
from gpupool.models.code import CodeLimits, CodeManifest, CodeMissing, CodeMissingReply, CodeStored
from gpupool.models.wire import CODE_DIGEST
from gpupool.services import audit, code, workloads
from gpupool.services.errors import Forbidden, NotFound
from gpupool.settings import Settings
from gpupool.store.blobs import CHUNK_BYTES, BlobStore, blob_root
from gpupool.store.tables import WorkloadRow

router = APIRouter(tags=["code"], responses=ERRORS)
ProjectQ = Annotated[str, Query(max_length=63)]
DigestP = Annotated[str, PathParam(pattern=CODE_DIGEST)]
OCTETS = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}


@lru_cache(maxsize=8)
def _store(root: Path) -> BlobStore:
    return BlobStore(root)


def store_of(settings: Settings) -> BlobStore:
    return _store(blob_root(settings.data_dir))


def max_bytes(settings: Settings) -> int:
    return settings.max_code_mib * 2**20


def quota_bytes(settings: Settings) -> int:
    """The most code one project keeps uploaded."""
    return settings.code_quota_mib * 2**20


@router.get("/code/limits", response_model=CodeLimits)
def code_limits(ctx: ContextDep, who: CurrentUser) -> CodeLimits:
    """How large a code tree this server takes, and the chunk size files are cut into."""
    return CodeLimits(max_bytes=max_bytes(ctx.settings), chunk_bytes=CHUNK_BYTES)


@router.post("/code/missing", response_model=CodeMissingReply)
def code_missing(body: CodeMissing, session: SessionDep, ctx: ContextDep, who: CurrentUser) -> CodeMissingReply:
    """Which of these blobs the project has not uploaded: only those need sending. Project members only."""
    return CodeMissingReply(missing=code.missing(session, store_of(ctx.settings), who, body.project, body.digests))


@router.put("/code/blobs/{digest}", status_code=204, openapi_extra={"requestBody": {"content": OCTETS}})
async def upload_code_blob(
    digest: DigestP, project: ProjectQ, request: Request, session: SessionDep, ctx: ContextDep, who: CurrentUser
) -> Response:
    """A chunk of a file (at most `chunk_bytes`), checked against its digest. Project members only."""
    data = await request.body()
    quota = quota_bytes(ctx.settings)
    await run_in_threadpool(code.put_blob, session, store_of(ctx.settings), who, project, digest, data, quota)
    return Response(status_code=204)


@router.put("/code/manifests", response_model=CodeStored)
def upload_code_manifest(
    body: CodeManifest, project: ProjectQ, session: SessionDep, ctx: ContextDep, who: CurrentUser
) -> CodeStored:
    """A code tree whose chunks the project has uploaded; its `code` is what a workload's `code` takes. Paths are
    checked (relative, no '..', each once, links inside the tree) and the total against the server's limit."""
    quota = quota_bytes(ctx.settings)
    return code.put_manifest(session, store_of(ctx.settings), who, project, body, max_bytes(ctx.settings), quota)


@router.post("/code/collect", response_model=dict[str, int])
def collect_code(
    session: SessionDep,
    ctx: ContextDep,
    who: CurrentUser,
    grace_s: Annotated[float, Query(ge=0, le=365 * 86400, allow_inf_nan=False)] = code.GC_GRACE_S,
) -> dict[str, int]:
    """Admins: forget uploads no workload names once `grace_s` has passed since last sent or used, and remove the
    bytes no project holds any more."""
    if not who.is_admin:
        raise Forbidden("only admins collect code")
    done = code.collect(session, store_of(ctx.settings), grace_s)
    return {"manifests": done.manifests, "blobs": done.blobs, "bytes": done.bytes}


async def _workload(
    request: Request,
    ref: str,
    ctx: ContextDep,
    session: SessionDep,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    project: Annotated[str | None, Query(max_length=63)] = None,
) -> WorkloadRow:
    """The workload whose code is read: by a reader of its project, or with the code token minted for it (which
    reads nothing else: another workload's code is not found)."""
    if creds is not None and plausible_token(creds.credentials) and code.is_code_token(creds.credentials):
        row = await run_in_threadpool(code.token_workload, session, creds.credentials)
        if row is None:
            raise HTTPException(401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"})
        if ref not in (str(row.id), row.name):
            raise NotFound(f"no workload named {ref!r}")
        audit.note(obj=f"workload/{row.name}")
        return row
    who = await get_principal(request, ctx, session, creds)
    return await run_in_threadpool(workloads.find, session, who, ref, project)


WorkloadDep = Annotated[WorkloadRow, Depends(_workload)]


@router.get("/workloads/{ref}/code", response_model=CodeManifest)
def workload_code(row: WorkloadDep, ctx: ContextDep) -> Response:
    """The workload's code manifest, as uploaded. Readers of its project, or its own code token."""
    return Response(code.read_manifest(store_of(ctx.settings), row), media_type="application/json")


@router.get(
    "/workloads/{ref}/code/blobs/{digest}",
    response_class=Response,
    responses={200: {"content": OCTETS}},
)
def workload_code_blob(digest: DigestP, row: WorkloadDep, session: SessionDep, ctx: ContextDep) -> Response:
    """A chunk its manifest names. Readers of its project, or its own code token."""
    data = code.read_blob(session, store_of(ctx.settings), row, digest)
    return Response(data, media_type="application/octet-stream")
