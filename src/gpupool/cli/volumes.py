"""Commands of the volumes part of the CLI: `gpupool volume create|list|delete`, and `gpupool cp` of a workload's
files, both ways."""

from __future__ import annotations

import io
import posixpath
import re
import tarfile
import time
from pathlib import Path
from typing import Annotated

import typer

from gpupool.cli.connection import Output, OutputOpt, client, emit_json, fail, print_table
from gpupool.cli.submit import ProjectOpt, project_of
from gpupool.client import volumes as api
from gpupool.client.code import human

volume_app = typer.Typer(help="A project's volumes: storage that outlives workloads (`submit --volume NAME:/path`).",
                         no_args_is_help=True)  # fmt: skip
MAX_UPLOAD = 512 * 2**20
"""The most `cp` sends in one go (the server's cap; see docs/data.md)."""
_REMOTE = re.compile(r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?|[0-9]{1,10}):(.*)$")


@volume_app.command("create")
def volume_create(
    name: str,
    size: Annotated[str, typer.Option("--size", help="Like 50GiB or 512MiB.")],
    project: ProjectOpt = None,
) -> None:
    """Create a volume; its storage is made when a workload first mounts it."""
    with client() as c:
        v = api.create_volume(c, project_of(c, project), name, size)
    print(f"volume {v.name} of {v.project} created ({_size(v.size_bytes)})")


@volume_app.command("list")
def volume_list(project: ProjectOpt = None, output: Output = OutputOpt) -> None:
    with client() as c:
        p = project_of(c, project)
        rows = api.list_volumes(c, p)
    if output is Output.json:
        emit_json(rows)
        return
    print_table(f"volumes of {p}", ("NAME", "SIZE", "IN USE BY", "CREATED BY", "CREATED"),
                ((r.name, _size(r.size_bytes), ", ".join(r.in_use_by) or "-", r.created_by,
                  time.strftime("%Y-%m-%d %H:%M", time.localtime(r.created_at))) for r in rows))  # fmt: skip


@volume_app.command("delete")
def volume_delete(name: str, project: ProjectOpt = None) -> None:
    """Delete a volume and its data (refused while a workload that has not finished mounts it)."""
    with client() as c:
        p = project_of(c, project)
        api.delete_volume(c, p, name)
    print(f"volume {name} of {p} deleted")


def _size(n: int) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if n >= size:
            return f"{n / size:g}{unit}" if n % size == 0 else f"{n / size:.1f}{unit}"
    return human(n)


def cp(
    source: Annotated[str, typer.Argument(help="NAME:PATH (a workload's file or directory) or a local path.")],
    dest: Annotated[str, typer.Argument(help="A local path, or NAME:PATH.")],
    rank: Annotated[int, typer.Option("--rank", help="Which member's working directory.")] = 0,
    project: Annotated[str | None, typer.Option("-p", "--project", help="The workload's project.")] = None,
) -> None:
    """Copy a workload's files (its working directory, running or finished) to here, or files from here into it."""
    remote_src, remote_dest = _REMOTE.match(source), _REMOTE.match(dest)
    if (remote_src is None) == (remote_dest is None):
        fail("name one workload path (NAME:PATH) and one local path", 2)
    with client() as c:
        if remote_src is not None:
            ref, path = remote_src.group(1), remote_src.group(3)
            data, is_tar = api.get_files(c, ref, path, rank, project)
            _save(data, is_tar, Path(dest), posixpath.basename(path.rstrip("/")) or ref)
            print(f"copied {ref}:{path or '.'} to {dest}")
            return
        assert remote_dest is not None
        ref, path = remote_dest.group(1), remote_dest.group(3)
        tar, into = _pack(Path(source), path)
        put = api.put_files(c, ref, into, tar, rank, project)
    print(f"copied {source} to {ref}:{path or '.'} ({put.files} files, {human(put.bytes)})")


def _save(data: bytes, is_tar: bool, dest: Path, name: str) -> None:
    if not is_tar:
        target = dest / name if dest.is_dir() else dest
        target.write_bytes(data)
        return
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        tar.extractall(dest, filter="data")  # the tar is the workload's: nothing of it lands outside dest


def _pack(local: Path, remote: str) -> tuple[bytes, str]:
    """A tar of `local`, and the directory of the workload's it is to be extracted into."""
    if not local.exists():
        fail(f"{local} does not exist", 2)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:") as tar:
        if local.is_dir():
            for p in sorted(local.rglob("*")):
                tar.add(p, arcname=p.relative_to(local).as_posix(), recursive=False)
            into = remote
        else:
            keep_name = remote in ("", ".") or remote.endswith("/")
            into = remote if keep_name else posixpath.dirname(remote)
            tar.add(local, arcname=local.name if keep_name else posixpath.basename(remote), recursive=False)
    if buf.tell() > MAX_UPLOAD:
        fail(f"{local} is {human(buf.tell())} as a tar; cp sends at most {human(MAX_UPLOAD)}", 2)
    return buf.getvalue(), into


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    app.add_typer(volume_app, name="volume")
    app.command("cp")(cp)
