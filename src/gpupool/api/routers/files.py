"""Routes of the files API: a workload's working directory, read (a file, a tar of a directory, or a listing) by
its project's readers and written (a tar, extracted into it) by its members."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from gpupool.api.deps import ContextDep, CurrentUser, SessionDep
from gpupool.api.errors import ERRORS
from gpupool.models.volumes import FileEntry, FilesPut
from gpupool.services import audit, files
from gpupool.services.errors import ServiceError

router = APIRouter(tags=["files"], responses=ERRORS)
PathQ = Annotated[str, Query(max_length=4096, description="Relative to the working directory; empty: all of it.")]
RankQ = Annotated[int, Query(ge=0, le=255)]
ProjectQ = Annotated[str | None, Query(max_length=63)]


@router.get("/workloads/{ref}/files", response_model=list[FileEntry], responses={200: {"content": {
    "application/octet-stream": {}, "application/x-tar": {}}}})  # fmt: skip
async def get_files(
    ref: str, session: SessionDep, ctx: ContextDep, who: CurrentUser, path: PathQ = "", rank: RankQ = 0,
    project: ProjectQ = None, listing: Annotated[bool, Query(alias="list")] = False,
) -> Response | list[FileEntry]:  # fmt: skip
    """A file's bytes, or a tar of a directory; `list=1`: the entries of a directory, for the portal. Running or
    finished (until its retention is over: 410 after)."""
    keep, storage = ctx.settings.workdir_retention_s, ctx.backend.capabilities().storage
    if listing:
        out: list[FileEntry] = await run_in_threadpool(
            files.list_files, session, who, storage, ref, project, rank, path, keep
        )
        return out
    data, is_tar = await run_in_threadpool(files.read_files, session, who, storage, ref, project, rank, path, keep)
    name = (path.rstrip("/").rsplit("/", 1)[-1] or ref) + (".tar" if is_tar else "")
    kind = "application/x-tar" if is_tar else "application/octet-stream"
    return Response(data, media_type=kind, headers={"content-disposition": f'attachment; filename="{name}"'})


@router.put("/workloads/{ref}/files", response_model=FilesPut)
async def put_files(
    ref: str, request: Request, session: SessionDep, ctx: ContextDep, who: CurrentUser, path: PathQ = "",
    rank: RankQ = 0, project: ProjectQ = None,
) -> FilesPut:  # fmt: skip
    """A tar body, extracted into the working directory under `path` (regular files and directories only)."""
    audit.note(obj=f"workload/{ref}/files")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > files.MAX_TRANSFER:
            err = ServiceError(f"the upload is larger than {files.MAX_TRANSFER} bytes, the most cp takes")
            err.status = 413
            raise err
    keep, storage = ctx.settings.workdir_retention_s, ctx.backend.capabilities().storage
    out: FilesPut = await run_in_threadpool(
        files.write_files, session, who, storage, ref, project, rank, path, bytes(body), keep
    )
    return out
