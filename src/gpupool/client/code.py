"""Packing a directory as a workload's code and uploading only what the server lacks.

`upload(client, directory, project)` walks the directory (never `.git`; nothing `.gitignore` or `.gpupoolignore`
excludes, read with `pathspec`, the library git-style tools use), refuses a tree over the server's size limit
naming its largest files, cuts files into chunks named by their SHA-256, asks the server which chunks the project
has not sent, sends those, and stores the manifest: its `sha256:<hex>` is what `WorkloadCreate.code` takes.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from gpupool.client.client import ApiError, Client
from gpupool.models.code import CodeFile, CodeManifest, resolve_link, tree_problem

IGNORE_FILES = (".gitignore", ".gpupoolignore")
"""Read in each directory, in this order: a .gpupoolignore line overrides a .gitignore line (`!data.csv` sends a
file git ignores); a deeper directory's files override its parents', as git's do."""
NEVER = frozenset({".git"})


class CodeError(ApiError):
    """A tree that cannot be sent as it is: too large (413), or unreadable (422). The reason says which files."""


@dataclass(frozen=True, slots=True)
class Chunk:
    path: Path
    offset: int
    size: int


@dataclass(slots=True)
class Packed:
    manifest: CodeManifest
    chunks: dict[str, Chunk] = field(default_factory=dict)
    """Where each chunk's bytes are, by digest (one place for chunks several files share)."""
    skipped: list[str] = field(default_factory=list)
    """Links that point outside the tree, and what is neither a file nor a link: not sent."""

    @property
    def size(self) -> int:
        return sum(f.size for f in self.manifest.files)


@dataclass(frozen=True, slots=True)
class Uploaded:
    code: str
    files: int
    size: int
    blobs_sent: int
    bytes_sent: int
    skipped: tuple[str, ...]


class _Ignore:
    """The ignore rules of every directory walked so far, deepest deciding first."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.specs: dict[str, pathspec.GitIgnoreSpec] = {}

    def enter(self, rel_dir: str) -> None:
        lines: list[str] = []
        for name in IGNORE_FILES:
            f = self.root / rel_dir / name
            if f.is_file():
                lines += f.read_text(errors="replace").splitlines()
        if lines:
            self.specs[rel_dir] = pathspec.GitIgnoreSpec.from_lines(lines)

    def ignored(self, rel: str, is_dir: bool) -> bool:
        parts = rel.split("/")
        for depth in range(len(parts) - 1, -1, -1):
            spec = self.specs.get("/".join(parts[:depth]))
            if spec is None:
                continue
            tail = "/".join(parts[depth:]) + ("/" if is_dir else "")
            decided = spec.check_file(tail).include
            if decided is not None:
                return decided
        return False


def _walk(root: Path) -> tuple[list[tuple[str, os.stat_result]], list[str]]:
    """(path, lstat) of every file and link to send, sorted by path; and what was passed over."""
    ignore = _Ignore(root)
    found: list[tuple[str, os.stat_result]] = []
    skipped: list[str] = []
    for top, dirs, files in os.walk(root, followlinks=False):
        rel_top = os.path.relpath(top, root).replace(os.sep, "/")
        rel_top = "" if rel_top == "." else rel_top
        ignore.enter(rel_top)
        keep_dirs = []
        for d in sorted(dirs):
            rel = f"{rel_top}/{d}" if rel_top else d
            if d in NEVER or ignore.ignored(rel, True):
                continue
            st = os.lstat(root / rel)
            if stat.S_ISLNK(st.st_mode):
                found.append((rel, st))  # a link to a directory travels as a link
            else:
                keep_dirs.append(d)
        dirs[:] = keep_dirs
        for name in files:
            rel = f"{rel_top}/{name}" if rel_top else name
            if ignore.ignored(rel, False):
                continue
            st = os.lstat(root / rel)
            if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                found.append((rel, st))
            else:
                skipped.append(rel)
    found.sort()
    return found, skipped


def _link_target(root: Path, rel: str) -> str | None:
    """The link's target as a path relative to the link, where it stays inside the tree; None otherwise."""
    target = os.readlink(root / rel)
    if os.path.isabs(target):
        try:
            target = os.path.relpath(os.path.realpath(target), os.path.realpath(root / posixpath.dirname(rel)))
        except ValueError:
            return None
    target = target.replace(os.sep, "/")
    inside = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
    if inside == ".." or inside.startswith("../") or inside.startswith("/"):
        return None
    return target


def _largest(entries: list[tuple[str, int]], count: int = 5) -> str:
    top = sorted(entries, key=lambda e: (-e[1], e[0]))[:count]
    return ", ".join(f"{path} ({human(size)})" for path, size in top)


def human(size: int) -> str:
    if size >= 2**20:
        return f"{size / 2**20:.1f} MiB"
    return f"{size / 1024:.1f} KiB" if size >= 1024 else f"{size} B"


def pack(directory: Path | str, max_bytes: int, chunk_bytes: int) -> Packed:
    """The manifest of a directory and where its chunks are. Sizes are checked before anything is read."""
    root = Path(directory)
    if not root.is_dir():
        raise CodeError(422, f"{root} is not a directory")
    found, skipped = _walk(root)
    sizes = [(rel, st.st_size) for rel, st in found if stat.S_ISREG(st.st_mode)]
    total = sum(size for _, size in sizes)
    if total > max_bytes:
        raise CodeError(
            413,
            f"{root} holds {total / 2**20:.1f} MiB to send, over the server's limit of {max_bytes / 2**20:.1f} MiB; "
            f"the largest files: {_largest(sizes)}. List what the job need not carry in {root / '.gpupoolignore'}",
        )
    packed = Packed(CodeManifest())
    files: list[CodeFile] = []
    for rel, st in found:
        if stat.S_ISLNK(st.st_mode):
            target = _link_target(root, rel)
            if target is None:
                packed.skipped.append(rel)
            else:
                files.append(CodeFile(path=rel, mode=0o777, link=target))
            continue
        whole = hashlib.sha256()
        chunks: list[str] = []
        size = 0
        with open(root / rel, "rb") as f:
            while data := f.read(chunk_bytes):
                whole.update(data)
                digest = "sha256:" + hashlib.sha256(data).hexdigest()
                packed.chunks.setdefault(digest, Chunk(root / rel, size, len(data)))
                chunks.append(digest)
                size += len(data)
        files.append(CodeFile(path=rel, mode=st.st_mode & 0o777, size=size, sha256=whole.hexdigest(), chunks=chunks))
    packed.manifest = CodeManifest(files=_inside(files, packed.skipped))
    packed.skipped += skipped
    packed.skipped.sort()
    return packed


def _inside(files: list[CodeFile], skipped: list[str]) -> list[CodeFile]:
    """The files less the links that lead outside the tree once every other link is followed (`d -> .` makes
    `e -> d/d/../..` leave it), or that loop: the server refuses those (resolve_link); they go to `skipped`."""
    while True:
        links = {f.path: f.link for f in files if f.link is not None}
        out = set()
        for path in links:
            try:
                resolve_link(links, path)
            except ValueError:
                out.add(path)
        if not out:
            return files
        skipped += sorted(out)
        files = [f for f in files if f.path not in out]


def _read(chunk: Chunk, digest: str) -> bytes:
    with open(chunk.path, "rb") as f:
        f.seek(chunk.offset)
        data = f.read(chunk.size)
    if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        raise CodeError(422, f"{chunk.path} changed while it was being uploaded; upload again")
    return data


def _project_of(client: Client) -> str:
    mine = client.whoami().projects
    if len(mine) != 1:
        raise CodeError(422, "name the project the code is for (you are in several, or none)")
    return mine[0]


def upload_tree(
    client: Client,
    directory: Path | str,
    project: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Uploaded:
    """Pack and upload `directory` for `project` (the caller's only project where None); only chunks the project
    has not sent before travel. `progress(sent, to_send)` is called after each chunk, in bytes."""
    project = project or _project_of(client)
    limits = client.code_limits()
    packed = pack(directory, limits.max_bytes, limits.chunk_bytes)
    blobs = bytes_sent = 0
    for _attempt in range(2):  # a second round for chunks collected between the question and the manifest
        missing = client.code_missing(project, sorted(packed.chunks))
        to_send = sum(packed.chunks[d].size for d in missing)
        for digest in missing:
            data = _read(packed.chunks[digest], digest)
            client.put_code_blob(project, digest, data)
            blobs += 1
            bytes_sent += len(data)
            if progress is not None:
                progress(bytes_sent, to_send)
        try:
            stored = client.put_code_manifest(project, packed.manifest)
        except ApiError as e:
            if e.status == 409 and _attempt == 0:
                continue
            raise
        return Uploaded(stored.code, stored.files, stored.size, blobs, bytes_sent, tuple(packed.skipped))
    raise AssertionError("unreachable")  # pragma: no cover


def upload(client: Client, directory: Path | str, project: str | None = None) -> str:
    """Upload `directory` as code for `project`: the `code` value a workload takes (`sha256:<hex>`)."""
    return upload_tree(client, directory, project).code


def fetch(client: Client, ref: str, into: Path | str, project: str | None = None) -> CodeManifest:
    """Write a workload's code into `into` (a Kubernetes init step does this with the workload's code token):
    each file checked against its SHA-256, links as links."""
    root = Path(into)
    manifest = client.workload_code(ref, project)
    problem = tree_problem(manifest)
    if problem is not None:
        raise CodeError(422, f"the server sent a tree that cannot be written safely: {problem}")
    for f in manifest.files:
        dest = root.joinpath(*f.path.split("/"))
        dest.parent.mkdir(parents=True, exist_ok=True)  # no entry is under a link (tree_problem)
        if f.link is not None:
            os.symlink(f.link, dest)
            continue
        whole = hashlib.sha256()
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC  # never through a link
        with open(os.open(dest, flags, 0o600), "wb") as out:
            for digest in f.chunks:
                data = client.workload_code_blob(ref, digest, project)
                whole.update(data)
                out.write(data)
        if whole.hexdigest() != f.sha256:
            raise CodeError(422, f"{f.path} arrived other than it was sent (its SHA-256 differs)")
        os.chmod(dest, f.mode)
    return manifest


def main(argv: list[str] | None = None) -> int:
    """`python -m gpupool.client.code --into DIR`: fetch the code of GPUPOOL_WORKLOAD_ID from GPUPOOL_URL with
    GPUPOOL_CODE_TOKEN (what a pod's init container runs)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m gpupool.client.code")
    parser.add_argument("--into", required=True)
    args = parser.parse_args(argv)
    try:
        url, token, ref = (os.environ[k] for k in ("GPUPOOL_URL", "GPUPOOL_CODE_TOKEN", "GPUPOOL_WORKLOAD_ID"))
    except KeyError as e:
        print(f"gpupool: {e.args[0]} is not set", file=sys.stderr)
        return 2
    try:
        with Client(url, token) as client:
            manifest = fetch(client, ref, args.into)
    except ApiError as e:
        print(f"gpupool: cannot fetch the code of workload {ref}: {e.reason}", file=sys.stderr)
        return 1
    print(f"gpupool: {len(manifest.files)} files of workload {ref}'s code in {args.into}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
