"""A workload's working directory, read and written by the server for `gpupool cp` (and the portal's files).

The directory is the tenant's: it may hold symlinks (or swap a directory for one while we look) meant to make a
root server read or write elsewhere. So nothing here resolves a path through the filesystem: every component is
opened relative to its parent's descriptor with O_NOFOLLOW (openat), from a descriptor of the working directory
itself, and a symlink met on the way is refused (the final entry of a listing or a tar is reported as a link,
never followed). What is written is owned by the project's identity.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from gpupool.backends.base import FileEntry, FilesError

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


@dataclass(frozen=True, slots=True)
class WorkdirFiles:
    """One workload's working directory, as `cp` reaches it; `uid` owns what is written (None: the server)."""

    root: str
    uid: int | None

    def list(self, rel: str) -> list[FileEntry]:
        return listing(self.root, rel)

    def read(self, rel: str, max_bytes: int) -> tuple[bytes, bool]:
        return read(self.root, rel, max_bytes)

    def extract(self, rel: str, data: bytes, max_bytes: int) -> tuple[int, int]:
        return extract(self.root, rel, data, self.uid, max_bytes)


def parts(rel: str) -> list[str]:
    """`rel`'s components; refused where one climbs out or is not a plain name."""
    out = [p for p in rel.replace("\\", "/").split("/") if p not in ("", ".")]
    if any(p == ".." or "\x00" in p for p in out):
        raise FilesError(f"{rel[:200]!r} is not a path inside the working directory")
    return out


@contextlib.contextmanager
def _open_dir(root: str, names: list[str], create_uid: int | None = None, create: bool = False) -> Iterator[int]:
    """A descriptor of root/names..., each step opened relative to the last with O_NOFOLLOW."""
    fd = os.open(root, _DIR)
    try:
        for name in names:
            if create:
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                    if create_uid is not None:
                        os.chown(name, create_uid, create_uid, dir_fd=fd, follow_symlinks=False)
                except FileExistsError:
                    pass
            try:
                nxt = os.open(name, _DIR, dir_fd=fd)
            except FileNotFoundError:
                raise FilesError(f"{'/'.join(names)} is not in the working directory", 404) from None
            except (NotADirectoryError, OSError) as e:
                raise FilesError(f"{'/'.join(names)}: {name!r} is a link or not a directory ({e.strerror})") from None
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def _kind(mode: int) -> Literal["file", "dir", "link", "other"]:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return "link" if stat.S_ISLNK(mode) else "other"


def listing(root: str, rel: str, limit: int = 10_000) -> list[FileEntry]:
    """The entries of a directory (one level), or the one entry of a file."""
    names = parts(rel)
    if names:
        with _open_dir(root, names[:-1]) as parent:
            try:
                st = os.stat(names[-1], dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                raise FilesError(f"{rel} is not in the working directory", 404) from None
            if not stat.S_ISDIR(st.st_mode):
                return [FileEntry("/".join(names), _kind(st.st_mode), st.st_size, st.st_mtime)]
    out: list[FileEntry] = []
    with _open_dir(root, names) as fd:
        for name in sorted(os.listdir(fd))[:limit]:
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                out.append(FileEntry("/".join([*names, name]), _kind(st.st_mode), st.st_size, st.st_mtime))
    return out


def read(root: str, rel: str, max_bytes: int) -> tuple[bytes, bool]:
    """A file's bytes, or a tar of a directory (links as links); and whether it is a tar."""
    names = parts(rel)
    if names:
        with _open_dir(root, names[:-1]) as parent:
            st = _lstat(parent, names[-1], rel)
            if stat.S_ISREG(st.st_mode):
                fd = os.open(names[-1], _FILE, dir_fd=parent)
                with os.fdopen(fd, "rb") as f:
                    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # swapped since it was looked at
                        raise FilesError(f"{rel} is not a regular file; it is not copied")
                    if os.fstat(f.fileno()).st_size > max_bytes:
                        raise FilesError(f"{rel} is larger than {max_bytes} bytes, the most cp takes", 413)
                    return f.read(), False
            if not stat.S_ISDIR(st.st_mode):
                raise FilesError(f"{rel} is a link or not a regular file; it is not copied")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:") as tar, _open_dir(root, names) as fd:
        _add_tree(tar, fd, "", buf, max_bytes)
    return buf.getvalue(), True


def _lstat(parent: int, name: str, rel: str) -> os.stat_result:
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        raise FilesError(f"{rel} is not in the working directory", 404) from None


def _add_tree(tar: tarfile.TarFile, fd: int, prefix: str, buf: io.BytesIO, max_bytes: int) -> None:
    for name in sorted(os.listdir(fd)):
        arc = f"{prefix}{name}"
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        info = tarfile.TarInfo(arc)
        info.mode, info.mtime = stat.S_IMODE(st.st_mode), st.st_mtime
        if stat.S_ISLNK(st.st_mode):
            info.type, info.linkname = tarfile.SYMTYPE, os.readlink(name, dir_fd=fd)
            tar.addfile(info)
        elif stat.S_ISDIR(st.st_mode):
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
            with contextlib.suppress(OSError):  # swapped for a link since: left out
                sub = os.open(name, _DIR, dir_fd=fd)
                try:
                    _add_tree(tar, sub, f"{arc}/", buf, max_bytes)
                finally:
                    os.close(sub)
        elif stat.S_ISREG(st.st_mode):
            try:
                ffd = os.open(name, _FILE, dir_fd=fd)
            except OSError:
                continue
            with os.fdopen(ffd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    continue
                info.size = os.fstat(f.fileno()).st_size
                if buf.tell() + info.size > max_bytes:
                    raise FilesError(f"the directory is larger than {max_bytes} bytes, the most cp takes", 413)
                tar.addfile(info, f)


def extract(root: str, rel: str, data: bytes, uid: int | None, max_bytes: int) -> tuple[int, int]:
    """Put a tar's regular files and directories under root/rel (made where missing); returns (files, bytes).
    A link, device or path climbing out in the tar is refused; an existing link on the way is never followed."""
    base = parts(rel)
    files = total = 0
    try:
        tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:")  # noqa: SIM115 - closed by the with below
    except tarfile.TarError as e:
        raise FilesError(f"the body is not a tar: {e}") from None
    with tar:
        for member in tar:
            names = [*base, *parts(member.name)]
            if member.isdir():
                with _open_dir(root, names, uid, create=True):
                    continue
            if not member.isfile():
                raise FilesError(f"{member.name!r}: only regular files and directories are copied in")
            if not names or len(names) == len(base):
                raise FilesError(f"{member.name!r} names no file")
            total += member.size
            if total > max_bytes:
                raise FilesError(f"the upload is larger than {max_bytes} bytes, the most cp takes", 413)
            src = tar.extractfile(member)
            assert src is not None
            with _open_dir(root, names[:-1], uid, create=True) as parent:
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
                try:
                    fd = os.open(names[-1], flags, stat.S_IMODE(member.mode) & 0o777 or 0o644, dir_fd=parent)
                except OSError as e:
                    raise FilesError(
                        f"{'/'.join(names)} cannot be written ({e.strerror}): a link or not a file"
                    ) from None
                with os.fdopen(fd, "wb") as out:
                    if not stat.S_ISREG(os.fstat(out.fileno()).st_mode):
                        raise FilesError(f"{'/'.join(names)} is not a regular file")
                    while chunk := src.read(1 << 20):
                        out.write(chunk)
                    if uid is not None:
                        os.fchown(out.fileno(), uid, uid)
            files += 1
    return files, total
