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
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from pathlib import Path

from gpupool.durable import fsync_dir
from gpupool.failpoints import failpoint
from gpupool.models.code import CodeManifest

_FICLONE = 0x40049409
"""ioctl(2) FICLONE: share the blob's extents copy-on-write (btrfs, XFS); the job's writes never reach the blob."""


class Blobs:
    """The blob area as the server's API writes it (gpupool.store.blobs, which the layers keep backends from
    importing): `<data>/code/blobs/<first two hex digits>/<hex>`. A test holds the two to the same layout."""

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "code" / "blobs"

    def path(self, digest: str) -> Path:
        h = digest.removeprefix("sha256:")
        return self.root / h[:2] / h

    def read(self, digest: str) -> bytes:
        return self.path(digest).read_bytes()


class CodePlacer:
    def __init__(self, workloads_dir: Path, blobs: Blobs) -> None:
        self.root = workloads_dir
        self.blobs = blobs

    def mark_path(self, workload_id: int) -> Path:
        return self.root / f"{workload_id}.code"

    def placed(self, workload_id: int) -> str | None:
        """The code digest placed in this workload's working directory, if any was."""
        try:
            return self.mark_path(workload_id).read_text().strip() or None
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
        staging = self.root / f".{workload_id}.staging-{os.getpid()}-{time.monotonic_ns()}"
        staging.mkdir(mode=0o700)
        made_dirs = {staging}
        for f in manifest.files:
            dest = staging / f.path
            for parent in reversed(dest.parents):
                if parent in made_dirs or not parent.is_relative_to(staging):
                    continue
                parent.mkdir(mode=0o755, exist_ok=True)
                made_dirs.add(parent)
                _own(parent, uid)
            if f.link is not None:
                os.symlink(f.link, dest)
            else:
                self._copy(f.chunks, dest)
                os.chmod(dest, f.mode)
            _own(dest, uid)
        _own(staging, uid)
        fsync_dir(staging)
        # Nothing started in a working directory without a mark: whatever is there (an empty directory a failed
        # launch prepared) goes.
        if workdir.exists():
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

    def _copy(self, chunks: list[str], dest: Path) -> None:
        with open(dest, "wb") as out:
            if not (len(chunks) == 1 and _reflink(self.blobs.path(chunks[0]), out.fileno())):
                for chunk in chunks:
                    with open(self.blobs.path(chunk), "rb") as src:
                        shutil.copyfileobj(src, out, 1024 * 1024)
                out.flush()
            os.fsync(out.fileno())

    def forget(self, workload_id: int) -> None:
        """The mark goes with the working directory (a workload deleted)."""
        for path in (self.mark_path(workload_id), self.root / f"{workload_id}.code.lock"):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _reflink(src: Path, out_fd: int) -> bool:
    with open(src, "rb") as f:
        try:
            fcntl.ioctl(out_fd, _FICLONE, f.fileno())
        except OSError:  # not a filesystem that shares extents, or across filesystems: copy the bytes
            return False
    return True


def _own(path: Path, uid: int | None) -> None:
    if uid is not None:
        os.chown(path, uid, uid, follow_symlinks=False)


def discard(data_dir: Path, workload_id: int) -> None:
    """A deleted workload's files: its working directory and its logs."""
    for path in (data_dir / "workloads" / str(workload_id), data_dir / "logs" / str(workload_id)):
        shutil.rmtree(path, ignore_errors=True)
