"""Mount points a member's volumes need in its view, made on the host (its system is read-only in the view), as
root: never through a link, and only in directories root owns, so a host path nobody expected is never made."""

from __future__ import annotations

import errno
import os


def make(path: str, create: bool = True) -> None:
    """Make the directory `path` on the host where it is missing, each step opened without following a link and
    in a directory root owns; an OSError says why not (a link, a file, another owner's directory on the way).
    `create`: False checks only."""
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in [p for p in path.split("/") if p]:
            if os.fstat(fd).st_uid != 0:
                raise OSError(errno.EPERM, f"{part}'s directory is not root's")
            try:
                step = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    return
                os.mkdir(part, 0o755, dir_fd=fd)
                step = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise OSError(e.errno, f"{part} is a link or a file") from None
                raise
            os.close(fd)
            fd = step
    finally:
        os.close(fd)
