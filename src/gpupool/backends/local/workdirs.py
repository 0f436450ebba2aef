"""A workload's code, copied into its working directory before its first member starts.

The copy is the workload's own (the job may write anywhere in it), so blobs are copied, never hard-linked: a
reflink where the filesystem makes one, bytes otherwise. It is built beside the working directory, owned by the
project's identity, synced, and swapped in by rename; then a mark (`<workloads>/<id>.code`, durable) says it is
in place. The launch protocol (runs.py) places code only while it holds the allocation's lock and its wrapper has
never run, and before it writes the launch's intent, so:

- a crash before the mark leaves no member started: the next launch builds the copy again, from scratch;
- a crash after the mark finds it there and starts the member in it, once;
- once any member has started, the copy is never made again (a requeued or resumed workload finds what its
  earlier attempts wrote, as it did before it had code), and gang members share one copy, placed by whichever
  launches first (the others wait on a lock of the workload's).

It runs as root, so it trusts nothing of the tree: the manifest is checked again (every link resolved through the
others, and refused unless it stays inside the tree: gpupool.models.code.tree_problem), every file is created
from its directory's descriptor with O_NOFOLLOW and O_EXCL and every directory opened with O_NOFOLLOW, so no link
placed earlier redirects a later write; and what it reads (blobs, its mark) is opened with O_NOFOLLOW|O_NONBLOCK,
taken only as a regular file, and capped in size. Nothing here takes a lock another workload's launch needs.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from gpupool.durable import fsync_dir
from gpupool.failpoints import failpoint
from gpupool.models.code import CodeManifest, tree_problem

_FICLONE = 0x40049409
"""ioctl(2) FICLONE: share the blob's extents copy-on-write (btrfs, XFS); the job's writes never reach the blob."""
MAX_READ_BYTES = 64 * 2**20
"""The most read of one file here: a chunk is at most 1 MiB, a manifest (its canonical JSON) a few MiB."""
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeTree(RuntimeError):
    """A code tree that cannot be placed safely: a path or link that would lead outside the working directory."""


@contextlib.contextmanager
def open_regular(path: Path, cap: int = MAX_READ_BYTES) -> Iterator[int]:
    """A descriptor of `path` for reading, if it is a regular file of at most `cap` bytes: never through a link
    (O_NOFOLLOW), never blocking on a FIFO or a device (O_NONBLOCK, then fstat)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        if st.st_size > cap:
            raise OSError(f"{path} is {st.st_size} bytes, over {cap}")
        os.set_blocking(fd, True)
        yield fd
    finally:
        os.close(fd)


def read_capped(path: Path, cap: int = MAX_READ_BYTES) -> bytes:
    with open_regular(path, cap) as fd, os.fdopen(os.dup(fd), "rb") as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise OSError(f"{path} grew past {cap} bytes while it was read")
    return data


class Blobs:
    """The blob area as the server's API writes it (gpupool.store.blobs, which the layers keep backends from
    importing): `<data>/code/blobs/<first two hex digits>/<hex>`. A test holds the two to the same layout."""

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "code" / "blobs"

    def path(self, digest: str) -> Path:
        h = digest.removeprefix("sha256:")
        return self.root / h[:2] / h

    def read(self, digest: str) -> bytes:
        return read_capped(self.path(digest))


class CodePlacer:
    def __init__(self, workloads_dir: Path, blobs: Blobs) -> None:
        self.root = workloads_dir
        self.blobs = blobs

    def mark_path(self, workload_id: int) -> Path:
        return self.root / f"{workload_id}.code"

    def placed(self, workload_id: int) -> str | None:
        """The code digest placed in this workload's working directory, if any was."""
        try:
            return read_capped(self.mark_path(workload_id), 4096).decode().strip() or None
        except FileNotFoundError:
            return None

    def place(self, workload_id: int, digest: str, workdir: Path, uid: int | None) -> bool:
        """Make `workdir` a fresh copy of the code tree `digest` unless it was placed already (True if placed now).
        `uid`: the identity that is to own it (None: the server's own)."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / f"{workload_id}.code.lock", os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # gang members launched together: one copies, the others find its mark
            if self.placed(workload_id) is not None:
                return False
            self._build(workload_id, digest, workdir, uid)
            return True
        finally:
            os.close(fd)

    def _build(self, workload_id: int, digest: str, workdir: Path, uid: int | None) -> None:
        for left in self.root.glob(f".{workload_id}.staging-*"):  # what a crash left half built
            shutil.rmtree(left, ignore_errors=True)
        manifest = CodeManifest.model_validate_json(self.blobs.read(digest))
        problem = tree_problem(manifest)  # the API checked it; as root, check again what is about to be placed
        if problem is not None:
            raise UnsafeTree(f"code {digest} cannot be placed: {problem}")
        staging = self.root / f".{workload_id}.staging-{os.getpid()}-{time.monotonic_ns()}"
        staging.mkdir(mode=0o700)
        top = os.open(staging, _DIR)
        try:
            self._fill(top, manifest, uid)
            _own(top, uid)
            os.fsync(top)
        finally:
            os.close(top)
        # Nothing started in a working directory without a mark: whatever is there (an empty directory a failed
        # launch prepared) goes.
        if workdir.exists() or workdir.is_symlink():
            trash = self.root / f".{workload_id}.staging-old-{time.monotonic_ns()}"
            workdir.rename(trash)
            shutil.rmtree(trash, ignore_errors=True)
        workdir.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(workdir)
        fsync_dir(workdir.parent)
        failpoint("code.before-mark")
        mark = self.mark_path(workload_id)
        tmp = mark.with_name(f"{mark.name}.tmp")
        with open(tmp, "w") as out:
            out.write(digest)
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(mark)
        fsync_dir(self.root)

    def _fill(self, top: int, manifest: CodeManifest, uid: int | None) -> None:
        """Write the tree's entries under the directory `top`, each from its own directory's descriptor: a
        directory is made and opened without following a link, a file created with O_EXCL|O_NOFOLLOW, a link
        made where nothing is (symlinkat fails on what exists), so nothing written leaves `top`."""
        where: tuple[str, int] = ("", top)  # the directory of the last entry, open (manifests are sorted)
        try:
            for f in manifest.files:
                parent, _, name = f.path.rpartition("/")
                if parent != where[0]:
                    if where[1] != top:
                        os.close(where[1])
                    where = ("", top)  # closed: never closed twice, should the next open fail
                    if parent:
                        where = (parent, _open_dirs(top, parent, uid))
                dir_fd = where[1]
                if f.link is not None:
                    os.symlink(f.link, name, dir_fd=dir_fd)
                    if uid is not None:
                        os.chown(name, uid, uid, dir_fd=dir_fd, follow_symlinks=False)
                    continue
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=dir_fd)  # fmt: skip
                try:
                    self._copy(f.chunks, fd)
                    os.fchmod(fd, f.mode)
                    _own(fd, uid)
                    os.fsync(fd)
                finally:
                    os.close(fd)
        finally:
            if where[1] != top:
                os.close(where[1])

    def _copy(self, chunks: list[str], out_fd: int) -> None:
        if len(chunks) == 1 and _reflink(self.blobs.path(chunks[0]), out_fd):
            return
        for chunk in chunks:
            with open_regular(self.blobs.path(chunk)) as src:
                while data := os.read(src, 1024 * 1024):
                    view = memoryview(data)
                    while view:
                        view = view[os.write(out_fd, view) :]

    def forget(self, workload_id: int) -> None:
        """The mark goes with the working directory (a workload deleted)."""
        for path in (self.mark_path(workload_id), self.root / f"{workload_id}.code.lock"):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _reflink(src: Path, out_fd: int) -> bool:
    with open_regular(src) as fd:
        try:
            fcntl.ioctl(out_fd, _FICLONE, fd)
        except OSError:  # not a filesystem that shares extents, or across filesystems: copy the bytes
            return False
    return True


def _open_dirs(top: int, rel: str, uid: int | None) -> int:
    """A descriptor of the directory `rel` under `top`, each component made (mode 755, owned by `uid`) where it
    is not there yet and opened with O_NOFOLLOW: a component that is a link, or anything but a directory, fails
    (ELOOP, ENOTDIR) instead of being followed."""
    fd = top
    try:
        for part in rel.split("/"):
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
                made = True
            except FileExistsError:
                made = False
            inner = os.open(part, _DIR, dir_fd=fd)
            if fd != top:
                os.close(fd)
            fd = inner
            if made:
                _own(fd, uid)
    except BaseException:
        if fd != top:
            os.close(fd)
        raise
    return fd


def _own(fd: int, uid: int | None) -> None:
    if uid is not None:
        os.fchown(fd, uid, uid)


def discard(data_dir: Path, workload_id: int) -> None:
    """A deleted workload's files: its working directory and its logs."""
    for path in (data_dir / "workloads" / str(workload_id), data_dir / "logs" / str(workload_id)):
        shutil.rmtree(path, ignore_errors=True)
