"""An app's Unix socket, reached by the server (root, where it sandboxes) without following what the tenant left.

A member's app directory is the project's own (it makes its socket there), so its `app.sock` may be anything the
tenant made it: a link to the host's container engine, to a system bus, or into another project's app directory.
Connecting by name would follow it, as root. So the socket is opened without following links (O_PATH|O_NOFOLLOW,
relative to the directory, itself opened without following), must be a socket owned by the directory's owner (the
uid the server gave the member: a tenant cannot make an inode owned by anyone else), and is connected to through
that descriptor (/proc/self/fd/N names the very inode checked). A plain socket's peer is checked once more with
SO_PEERCRED: the process listening must run as that uid too."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import struct
from collections.abc import Iterator
from pathlib import Path


class NotTheApp(OSError):
    """What is at the app's socket is not the member's socket."""


@contextlib.contextmanager
def pinned(path: str) -> Iterator[str]:
    """A path that names the member's socket at `path` and nothing else, valid inside the block: connect to it
    there. NotTheApp where `path` is a link, not a socket, or owned by someone other than its directory's owner."""
    where = Path(path)
    nofollow = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
    directory = os.open(where.parent, nofollow | os.O_DIRECTORY)
    try:
        owner = os.fstat(directory).st_uid
        fd = os.open(where.name, nofollow, dir_fd=directory)  # a link is opened as itself, not followed
        try:
            st = os.fstat(fd)
            if not stat.S_ISSOCK(st.st_mode):
                raise NotTheApp(f"{path} is not a socket")
            if st.st_uid != owner:
                raise NotTheApp(f"{path} belongs to uid {st.st_uid}, not to its member ({owner})")
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
    finally:
        os.close(directory)


def owner(path: str) -> int:
    """Who owns the app directory `path` is in: the uid its member runs as."""
    return os.lstat(Path(path).parent).st_uid


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process that listens at the other end of a connected Unix socket."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def connect(path: str, timeout_s: float) -> socket.socket:
    """A connection to the member's socket at `path`, its listener checked to run as the member's uid."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        conn.settimeout(timeout_s)
        with pinned(path) as name:
            conn.connect(name)
        listener = peer_uid(conn)
        if listener != owner(path):
            raise NotTheApp(f"{path} is listened on by uid {listener}, not by its member")
    except BaseException:
        conn.close()
        raise
    return conn
